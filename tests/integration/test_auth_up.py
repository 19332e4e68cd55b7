"""`rlfleet up` with a cluster token: the launcher hands `RLFLEET_TOKEN` to every child, every
client sends it (workers to the coordinator, the coordinator's task pushes, the launcher's
status polling), and the run trains to its budget without one request refused."""

from __future__ import annotations

import json
from pathlib import Path

from .helpers import small_config

MAX_ENV_STEPS = 5000
TOKEN = "integration-test-token"
# What a refused request leaves in a log: HttpError's "-> 401", the guard's own messages.
REFUSALS = ("-> 401", "Authorization: Bearer", "not this cluster's token")


def test_up_with_a_token_trains_without_a_refused_request(launch, tmp_path: Path):
    config = small_config(tmp_path / "small.yaml")
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", "--max-env-steps", str(MAX_ENV_STEPS), env={"RLFLEET_TOKEN": TOKEN})
    code = up.wait(timeout=150)
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["error"] is None
    assert summary["env_steps"] >= MAX_ENV_STEPS
    assert summary["train_iterations"] > 0
    logs = {p.name: p.read_text(errors="replace") for p in (run_dir / "logs").iterdir()}
    assert {"coordinator.log", "learner.log", "collector-1.log"} <= set(logs)
    # The coordinator saw the token (it warns when it runs open).
    assert "no API token" not in logs["coordinator.log"]
    for name in ("learner.log", "collector-1.log"):
        assert "registered as" in logs[name], name
    for name, text in {**logs, "rlfleet up stderr": up.stderr}.items():
        for refusal in REFUSALS:
            assert refusal not in text, f"{name} shows a refused request:\n{text[-3000:]}"
    up.assert_no_orphans()
