"""`docker compose up` for real: the image built, the stack run with a token, the coordinator
served by gunicorn, collectors scaled 1 -> 3 -> 1 through the scaler (the Docker Engine API)
while it trains, a collector killed, the learner and the coordinator crashed (their restart
policy brings them back, the coordinator resuming), the coordinator stopped and started by
hand (SIGTERM: its final snapshot, exit 0, and the run restored), the run solved with the
ledger balanced at every moment, and `docker compose down -v` leaving nothing behind.

The env sleeps 1 ms a step (tests/userland, mounted into the containers), so collectors, not
the two cores, limit env steps/s, and adding collectors must add env steps/s. Evaluation
starts only at EVAL_FROM env steps, after every fault: the run cannot end before them."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from chaos.harness import Monitor
from integration.helpers import REPO, free_port, wait_for

from bench.compose_stack import Stack

EVAL_FROM = 90_000


def run_config() -> dict:
    data = yaml.safe_load((REPO / "configs" / "cartpole-ppo.yaml").read_text())
    data["name"] = "compose-test"
    data["env"] = {"id": "my_rl:SlowCartPole", "num_envs": 8, "kwargs": {"step_s": 0.001}}
    data["eval"].update(every_env_steps=10_000, start_env_steps=EVAL_FROM)
    data["coordinator"] = {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 4.0}
    data["checkpoint"] = {"every_train_iterations": 100}
    data["stop"] = {"max_wall_s": 900}
    return data


def overrides(tmp_path: Path) -> Path:
    """The user's env (tests/userland) and the run's config, mounted into every role."""
    userland = tmp_path / "userland"
    shutil.copytree(REPO / "tests" / "userland", userland)
    (userland / "run.yaml").write_text(yaml.safe_dump(run_config(), sort_keys=False))
    for path in [tmp_path, userland, *userland.iterdir()]:  # the containers run as uid 10001
        path.chmod(0o755 if path.is_dir() else 0o644)
    mount = [f"{userland}:/userland:ro"]
    env = {"PYTHONPATH": "/userland"}
    data = {"services": {
        "coordinator": {"environment": {**env, "RLFLEET_CONFIG": "/userland/run.yaml",
                                        "RLFLEET_RUN_DIR": "/runs/compose-test"},
                        "volumes": mount},
        "learner": {"environment": env, "volumes": mount},
        "collector": {"environment": env, "volumes": mount},
        "scaler": {"environment": {"RLFLEET_GRACE_S": "30", "RLFLEET_INTERVAL_S": "1"}},
    }}
    path = tmp_path / "compose.test.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def collectors(status: dict, state: str = "alive") -> list[dict]:
    return [w for w in status["workers"] if w["role"] == "collector" and w["state"] == state]


def scale(stack: Stack, n: int) -> None:
    out = subprocess.run([sys.executable, "-m", "rlfleet", "scale", "--collectors", str(n),
                          "--coordinator", stack.url], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, RLFLEET_TOKEN=stack.token))
    assert out.returncode == 0, out.stderr
    assert f"collectors wanted: {n}" in out.stdout


def steady_rate(stack: Stack, n: int) -> float:
    """env steps/s over 4 s of the coordinator's clock, once `n` collectors all collect."""
    wait_for(lambda: len(collectors(stack.status())) == n, 120, f"{n} collectors alive")
    wait_for(lambda: all(w["status"].get("env_steps", 0) > 0
                         for w in collectors(stack.status())), 60, "every collector collecting")
    first = stack.status()["counters"]["env_steps"]
    wait_for(lambda: stack.status()["counters"]["env_steps"] > first + 3000, 60,
             "3000 more env steps")
    start = stack.status()
    wait_for(lambda: stack.status()["run"]["wall_seconds"] > start["run"]["wall_seconds"] + 4,
             30, "a 4 s window")
    end = stack.status()
    return ((end["counters"]["env_steps"] - start["counters"]["env_steps"])
            / (end["run"]["wall_seconds"] - start["run"]["wall_seconds"]))


def before_eval(stack: Stack, what: str) -> None:
    steps = stack.status()["counters"]["env_steps"]
    assert steps < EVAL_FROM, f"{what} came after evaluation could start ({steps} env steps)"


def gunicorn_serves(stack: Stack) -> None:
    """The coordinator's container runs gunicorn (`docker compose top`), with one worker and
    its access log on stdout."""
    top = stack.compose("top", "coordinator").stdout
    assert "gunicorn" in top, top
    log = stack.logs("coordinator")
    assert "Starting gunicorn" in log and "Using worker: gthread" in log, log[-3000:]
    assert log.count("Booting worker") == 1, log[-3000:]
    assert re.search(r'"POST /api/v1/chunks HTTP/1\.1" 200', log), log[-3000:]


@pytest.mark.timeout(1200)
def test_compose_stack_scales_survives_crashes_and_solves(docker_env, tmp_path):
    from bench.compose_stack import build_image

    build_s = build_image(docker_env)
    print(f"docker build: {build_s:.1f} s")
    stack = Stack(f"rlfleet-test-{os.getpid()}", docker_env, secrets.token_hex(16), free_port(),
                  overrides=[overrides(tmp_path)], profiles=["scaler"])
    monitor = Monitor(stack)  # type: ignore[arg-type]  # status() and get() are all it uses
    t0 = time.monotonic()
    try:
        stack.up()
        wait_for(lambda: stack.status()["counters"]["env_steps"] > 0, 180, "the first chunk")
        up_s = time.monotonic() - t0
        monitor.start()
        gunicorn_serves(stack)

        # 1 -> 3: the scaler adds two containers; they register and add env steps/s.
        one = steady_rate(stack, 1)
        scale(stack, 3)
        three = steady_rate(stack, 3)
        assert three > 1.6 * one, (one, three)
        assert len(stack.containers("collector")) == 3
        before_eval(stack, "scaling up")

        # A collector killed by hand: `docker kill` is not a crash, so its restart policy
        # leaves it down; the scaler sees 2 of the 3 wanted and adds one.
        victim = stack.containers("collector")[-1]["Names"]
        victim_id = stack.inspect(victim)["Config"]["Hostname"]  # its worker id
        stack.docker("kill", victim)
        wait_for(lambda: victim not in [c["Names"] for c in stack.containers("collector")]
                 and len(stack.containers("collector")) == 3, 60, "a replacement collector")
        wait_for(lambda: victim_id not in [w["worker_id"] for w in collectors(stack.status())],
                 60, "the killed collector declared dead")
        wait_for(lambda: len(collectors(stack.status())) == 3, 120, "3 collectors alive again")
        wait_for(lambda: all(w["chunks_accepted"] > 0 for w in collectors(stack.status())), 120,
                 "the replacement's first chunks")
        before_eval(stack, "the collector kill")

        # 3 -> 1: the scaler drains two; each reported every chunk it wrote before leaving
        # (before the coordinator's crash: its count per worker starts again after one).
        scale(stack, 1)
        wait_for(lambda: len(stack.containers("collector")) == 1, 120,
                 "the scaler to drain two collectors")
        status = stack.status()
        assert len(collectors(status)) == 1 and status["run"]["state"] == "running"
        scaler_log = stack.logs("scaler")
        drained = re.findall(r"(\S+-collector-\d+) drained: (\d+) chunks written, (\d+) reported",
                             scaler_log)
        assert len(drained) == 2, scaler_log[-3000:]
        for name, written, reported in drained:
            worker = next(w for w in status["workers"] if w["worker_id"] == name)
            assert worker["state"] == "left", worker
            assert int(written) == int(reported) == worker["chunks_accepted"] > 0, worker
        before_eval(stack, "scaling down")

        # The learner crashes: restarted by its policy, it resumes from its checkpoint.
        wait_for(lambda: stack.status()["counters"]["train_iterations"] >= 150, 120,
                 "the learner past its first checkpoint")
        version = stack.status()["counters"]["policy_version"]
        learner = stack.containers("learner")[0]["Names"]
        restarts = stack.crash(learner)
        wait_for(lambda: stack.inspect(learner)["RestartCount"] > restarts, 60,
                 "the learner restarted")
        wait_for(lambda: stack.status()["counters"]["policy_version"] > version + 2, 120,
                 "new policy versions after the learner crash")
        assert "resumed from checkpoint" in stack.logs("learner")
        before_eval(stack, "the learner crash")

        # The coordinator crashes: restarted with --resume, it restores the run from Redis;
        # the workers register again and go on.
        coordinator = stack.containers("coordinator")[0]["Names"]
        before = stack.status()
        acknowledged, steps = before["ledger"]["acknowledged"], before["counters"]["env_steps"]
        restarts = stack.crash(coordinator)
        wait_for(lambda: stack.inspect(coordinator)["RestartCount"] > restarts, 60,
                 "the coordinator restarted")
        wait_for(lambda: stack.status()["counters"]["env_steps"] > steps + 2000, 120,
                 "env steps after the coordinator crash")
        assert stack.status()["ledger"]["acknowledged"] >= acknowledged
        assert "restored run at" in stack.logs("coordinator")
        before_eval(stack, "the coordinator crash")

        # Stopped by hand: SIGTERM to gunicorn, which finishes its requests, writes the final
        # snapshot and exits 0; started again, the coordinator restores the run from it.
        # (`docker stop`, not `docker compose stop`, which would stop its dependents too)
        stack.docker("stop", coordinator, timeout=120)
        assert stack.inspect(coordinator)["State"]["ExitCode"] == 0, \
            stack.logs("coordinator")[-3000:]
        stopped = stack.logs("coordinator")
        assert "Handling signal: term" in stopped and "Shutting down: Master" in stopped, \
            stopped[-3000:]
        stack.docker("start", coordinator, timeout=120)
        resumed = wait_for(lambda: stack.status(), 120, "the coordinator started again")
        assert stack.logs("coordinator").count("restored run at") >= 2
        assert resumed["counters"]["env_steps"] > steps + 2000, resumed["counters"]
        assert resumed["ledger"]["acknowledged"] >= acknowledged
        wait_for(lambda: stack.status()["counters"]["env_steps"]
                 > resumed["counters"]["env_steps"] + 2000, 120,
                 "env steps after the coordinator's stop and start")
        before_eval(stack, "the coordinator's stop and start")

        # Up again to finish: the run must solve, with the ledger balanced all along.
        scale(stack, 3)
        final = wait_for(lambda: (s := stack.status())["run"]["state"] == "stopped" and s, 600,
                         "the run to end")
        assert final["run"]["solved"] is True, final["run"]
        assert final["ledger"]["balanced"], final["ledger"]
        print(f"compose: first chunk {up_s:.1f} s after up, solved at "
              f"{final['counters']['env_steps']} env steps, {time.monotonic() - t0:.0f} s "
              f"after up; 1 collector {one:.0f} env steps/s, 3 collectors {three:.0f}")
    finally:
        monitor.stop.set()
        stack.down()
    assert monitor.answers > 20 and not monitor.violations, monitor.violations[:5]
    assert stack.leftovers() == {}, stack.leftovers()
