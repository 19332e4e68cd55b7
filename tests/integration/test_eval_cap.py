"""`eval.max_steps` through `rlfleet up`: on an env whose episodes never end (no terminal
state, no time limit), evaluations still finish, cut at the cap, say how many episodes were
truncated, and the collector that ran them goes on collecting; `rlfleet play` and
`rlfleet export --source policy` end their episodes at the same cap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import requests

from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.telemetry.rundata import load_run

from .helpers import REPO, coordinator_url, marked_env, small_config, wait_for

USERLAND = REPO / "tests" / "userland"
CAP = 50


def _evaluations(url: str) -> list[dict]:
    resp = requests.get(f"{url}{API}/evaluations", timeout=5)
    resp.raise_for_status()
    return resp.json()["evaluations"]


def test_evaluations_of_an_endless_env_end_at_the_cap_and_collection_goes_on(
        launch, tmp_path: Path):
    config = small_config(tmp_path / "endless.yaml", env={"id": "endless:Endless",
                                                           "num_envs": 2},
                          eval={"every_env_steps": 500, "episodes": 4, "num_envs": 2,
                                "max_steps": CAP},
                          stop={"max_env_steps": 400_000, "max_wall_s": 120})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", env={"PYTHONPATH": str(USERLAND)})
    url = wait_for(lambda: coordinator_url(up), 60, "the coordinator's URL")
    done = wait_for(lambda: len(_evaluations(url)) >= 2 and _evaluations(url), 90,
                    "two evaluations")
    requests.post(f"{url}{API}/run/stop", timeout=5).raise_for_status()
    code = up.wait(timeout=60)
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"

    # the collector went on collecting after its first evaluation, and evaluated again
    assert done[1]["env_steps"] > done[0]["env_steps"]
    for result in done:
        for mode in ("deterministic", "stochastic"):
            summary = result[mode]
            assert summary["episodes"] == 4 and summary["truncated"] == 4, result
            assert summary["length_mean"] == CAP
    # the summary is logged: eval/<mode>/truncated
    run = load_run(run_dir)
    _, logged, _ = run.series("eval/deterministic/truncated")
    assert len(logged) >= 2 and (logged == 4).all()
    # ... and every evaluation episode in the episode table says it was cut
    table = run.episodes
    evals = table[table["evaluation"]]
    assert len(evals) >= 16 and evals["truncated"].all() and (evals["length"] == CAP).all()
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] >= \
        done[1]["env_steps"]
    up.assert_no_orphans()

    # what plays or rolls out the trained policy outside an evaluation is cut at the cap too
    env = {**marked_env("eval-cap-tools"), "PYTHONPATH": str(USERLAND)}
    played = subprocess.run([sys.executable, "-m", "rlfleet", "play", str(run_dir),
                             "--episodes", "2"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert played.returncode == 0, played.stderr[-2000:]
    assert played.stdout.count(f" {CAP} ") >= 2, played.stdout  # each episode's length
    exported = subprocess.run([sys.executable, "-m", "rlfleet", "export", str(run_dir),
                               "--out", str(tmp_path / "datasets"), "--source", "policy",
                               "--episodes", "3"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr[-2000:]
