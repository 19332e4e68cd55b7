"""A storage password given to `rlfleet up` in the Redis URL trains the run and appears in no
log, answer or file of it: the coordinator hands out the URL redacted, and every process the
launcher starts finds the password in its environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import requests
from redis_server import RedisServer

from .helpers import REPO, free_port, small_config, wait_for

PASSWORD = "pw-3f9c1e77-never-shown"
MAX_ENV_STEPS = 5000


@pytest.fixture
def locked_redis(tmp_path: Path):
    server = RedisServer(tmp_path / "redis-data", password=PASSWORD)
    server.workdir.mkdir()
    server.start()
    yield server
    server.close()


def _answers(base: str) -> dict[str, str]:
    """What the coordinator answers anyone who asks, while the run is on."""
    out = {}
    for path in ("/api/v1/status", "/api/v1/workers", "/api/v1/tasks", "/api/v1/run",
                 "/api/v1/buffers", "/metrics", "/openapi.json"):
        out[path] = requests.get(base + path, timeout=5).text
    reg = requests.post(base + "/api/v1/workers", timeout=5,
                        json={"role": "collector", "url": "http://127.0.0.1:9"})
    out["register"] = reg.text
    info = reg.json()
    requests.delete(f"{base}/api/v1/workers/{info['worker_id']}", timeout=5)
    assert info["storage"].startswith("redis://:***@127.0.0.1"), info["storage"]
    return out


def test_a_storage_password_is_used_and_never_shown(launch, tmp_path, locked_redis):
    config = small_config(tmp_path / "small.yaml")
    run_dir, port = tmp_path / "run", free_port()
    url = f"redis://:{PASSWORD}@127.0.0.1:{locked_redis.port}/0"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--port", str(port), "--max-env-steps", str(MAX_ENV_STEPS), "--storage", url)
    base = f"http://127.0.0.1:{port}"

    def running() -> bool:
        try:
            return requests.get(base + "/api/v1/status", timeout=2).json()[
                "counters"]["env_steps"] > 0
        except (requests.RequestException, ValueError):
            return False

    wait_for(running, 90, "the run to collect")
    answers = _answers(base)
    client = redis.Redis(port=locked_redis.port, password=PASSWORD)
    assert client.keys(f"rlfleet:{run_dir.name}:*"), "the run keeps its data in the Redis"
    code = up.wait(timeout=150)
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["error"] is None and summary["env_steps"] >= MAX_ENV_STEPS
    assert summary["storage"] == f"redis://:***@127.0.0.1:{locked_redis.port}/0"

    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "metrics.jsonl" for p in files) and len(files) > 5
    seen = {str(p.relative_to(run_dir)): p.read_bytes() for p in files}
    seen.update({k: v.encode() for k, v in answers.items()})
    seen.update({"stdout": up.stdout.encode(), "stderr": up.stderr.encode()})
    leaks = [name for name, data in seen.items() if PASSWORD.encode() in data]
    assert not leaks, f"the password appears in {leaks}"
    up.assert_no_orphans()

    # The run's config names the storage redacted: resuming needs the password again.
    resume = subprocess.run(
        [sys.executable, "-m", "rlfleet", "resume", str(run_dir), "--continue"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert resume.returncode != 0
    assert "RLFLEET_STORAGE_PASSWORD_FILE" in resume.stderr and PASSWORD not in resume.stderr
