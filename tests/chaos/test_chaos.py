"""Chaos: a real `rlfleet up` run trains CartPole while, at moments drawn from a seed, a
collector, the learner and the coordinator are SIGKILLed (and, with the Redis backend,
Redis is killed and started again). After each fault the run must carry on; throughout,
the ledger must balance and no buffer may index a chunk twice; at the end the run must
reach its stop value.

The seed is `RLFLEET_CHAOS_SEED` (default 7), printed with every failure, so a failing
schedule can be replayed. Faults are placed by env steps (the run's own clock), each after
the previous one has recovered, so the schedule does not depend on the machine's speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
from integration.helpers import BASE_CONFIG, _merge, wait_for
from redis_server import RedisServer

from .harness import Monitor, Run

SEED = int(os.environ.get("RLFLEET_CHAOS_SEED", "7"))
FIRST_EVAL = 24_000  # env steps; every fault is placed well before it
# Another run to torture (say configs/cartpole-ppo.yaml); CI runs the default, DQN.
CONFIG = Path(os.environ.get("RLFLEET_CHAOS_CONFIG", str(BASE_CONFIG)))



def chaos_config(path: Path, storage: str) -> Path:
    import yaml

    data = yaml.safe_load(CONFIG.read_text())
    data = _merge(data, {
        "storage": storage,
        # Fast failure detection and frequent snapshots: recoveries within seconds.
        "coordinator": {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3.0,
                        "snapshot_interval_s": 2.0, "gc_interval_s": 2.0,
                        "orphan_grace_s": 10.0},
        "checkpoint": {"every_train_iterations": 200},
        # A lucky early policy can score 500 within a few thousand env steps: the first
        # evaluation comes after the last fault's moment, so every fault happens.
        "eval": {"start_env_steps": FIRST_EVAL},
        # What a collector may pile up while the coordinator is down: it is reported at
        # once when it returns, and must not carry the run past the first evaluation.
        "collector": {"max_held_chunks": 16},
        "stop": {"max_wall_s": 300},
    })
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# -- Redis of the test's own -----------------------------------------------------------------

# -- faults ------------------------------------------------------------------------------------

def _env_steps(run: Run) -> int:
    return run.status()["counters"]["env_steps"]


def carries_on(run: Run, what: str, timeout: float = 60) -> None:
    """Env steps and train iterations both move on from where they are now (or the run
    ended meanwhile: whether it was solved is checked at the end)."""
    start = wait_for(lambda: run.ended() or run.status(), timeout,
                     f"the coordinator to answer after {what}")
    if start is True:
        return
    e0, i0 = start["counters"]["env_steps"], start["counters"]["train_iterations"]

    def moved() -> bool:
        if run.ended():
            return True
        c = run.status()["counters"]
        return c["env_steps"] >= e0 + 1000 and c["train_iterations"] >= i0 + 50

    wait_for(moved, timeout, f"the run to carry on after {what} (seed {SEED})")


def all_alive(run: Run, registrations: dict[str, int]) -> dict:
    s = run.status()
    alive = {w["worker_id"]: w for w in s["workers"] if w["state"] == "alive"}
    if not {"learner", "collector-1", "collector-2"} <= set(alive):
        return {}
    if any(alive[w]["registrations"] < n for w, n in registrations.items()):
        return {}
    return s


def kill_collector(run: Run, rng: random.Random) -> str:
    victim = rng.choice(["collector-1", "collector-2"])
    before = run.worker(run.status(), victim)["registrations"]
    run.kill("collector", victim)
    wait_for(lambda: all_alive(run, {victim: before + 1}), 60,
             f"{victim} restarted and registered again (seed {SEED})")
    return victim


def kill_learner(run: Run, rng: random.Random) -> str:
    # Past its first checkpoint (every 200 iterations), so the restart has one to resume.
    wait_for(lambda: run.status()["counters"]["train_iterations"] >= 250, 60,
             "the learner's first checkpoint")
    s = run.status()
    before, version = run.worker(s, "learner")["registrations"], s["counters"]["policy_version"]
    run.kill("learner")
    wait_for(lambda: all_alive(run, {"learner": before + 1}), 90,
             f"the learner restarted and registered again (seed {SEED})")
    wait_for(lambda: run.status()["counters"]["policy_version"] > version, 60,
             f"a policy version newer than {version} after the learner's restart")
    return "learner"


def kill_coordinator(run: Run, monitor: Monitor, rng: random.Random) -> str:
    acknowledged = run.status()["ledger"]["acknowledged"]
    run.kill("coordinator")
    s = wait_for(lambda: all_alive(run, {}), 90,
                 f"the coordinator back and every worker registered with it (seed {SEED})")
    # Everything acknowledged before the kill is still accounted for.
    assert s["ledger"]["acknowledged"] >= acknowledged, (acknowledged, s["ledger"])
    return "coordinator"


def restart_redis(run: Run, server: RedisServer, rng: random.Random) -> str:
    server.kill()
    outage = rng.uniform(0.5, 2.0)
    time.sleep(outage)  # the outage itself: nothing to wait for, it is the fault
    server.start()
    return "redis"


# -- the suite ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["directory", "redis"])
def test_the_run_survives_every_role_being_killed(tmp_path, launch, backend):
    rng = random.Random(f"{SEED}-{backend}")
    server = None
    if backend == "redis":
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed")
        server = RedisServer(tmp_path)
        server.start()
        storage = server.url
    else:
        storage = str(tmp_path / "run" / "storage")
    run_dir = tmp_path / "run"
    config = chaos_config(tmp_path / "chaos.yaml", storage)
    up = launch("--config", str(config), "--collectors", "2", "--run-dir", str(run_dir),
                "--quiet", "--max-restarts", "5")
    run = Run(up, run_dir)
    monitor = Monitor(run)
    try:
        wait_for(lambda: _env_steps(run) > 0, 90, "the first chunk")
        monitor.start()
        faults = ["collector", "learner", "coordinator"] + (["redis"] if server else [])
        rng.shuffle(faults)
        done: list[str] = []
        for i, fault in enumerate(faults):
            at = 1500 + 2000 * i + rng.randrange(1000)  # the last before 9,000
            wait_for(lambda at=at: _env_steps(run) >= at, 120,
                     f"env step {at} for fault {fault} (seed {SEED})")
            assert up.proc.poll() is None, f"the run ended before the {fault} fault: " \
                f"{up.proc.returncode}, seed {SEED}, done {done}"
            if fault == "collector":
                victim = kill_collector(run, rng)
            elif fault == "learner":
                victim = kill_learner(run, rng)
            elif fault == "coordinator":
                victim = kill_coordinator(run, monitor, rng)
            else:
                assert server is not None
                victim = restart_redis(run, server, rng)
            carries_on(run, f"killing {victim}")
            done.append(victim)
        code = up.wait(240)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert code == 0 and summary["solved"], (
            f"seed {SEED}: exit {code}, faults {done}, summary {summary}\n{up.stderr[-3000:]}")
        # Each killed role was restarted once; Redis's restart restarted no role.
        expected = {v: 1 for v in done if v != "redis"}
        assert summary["restarts"] == expected, (summary["restarts"], done)
        logs = run_dir / "logs"
        # The coordinator came back from storage, not from nothing; the learner from its
        # checkpoint.
        assert "restored run at" in (logs / "coordinator.log").read_text()
        assert "resumed from checkpoint at train iteration" in \
            (logs / "learner.log").read_text()
    finally:
        monitor.stop.set()
        if up.proc.poll() is None:
            up.proc.send_signal(signal.SIGINT)
        with contextlib.suppress(Exception):
            up.wait(60)
        if server is not None:
            server.close()
    assert not monitor.violations, f"seed {SEED}: {monitor.violations[:5]}"
    assert monitor.answers > 20 and monitor.chunk_checks > 2, (monitor.answers,
                                                                monitor.chunk_checks)
