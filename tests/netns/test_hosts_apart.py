"""Hosts apart: Redis, the coordinator, the learner and two collectors each on a host of its
own (a network namespace with its own address, `hosts.py`), so every URL a role advertises
or is given (the coordinator's, each worker's, the Redis storage the coordinator announces)
must work across hosts, and the network between them can fail as networks do.

One run goes through, in order:
1. every link shaped for the whole run: what each host sends is delayed 50 ms (hosts are a
   100 ms round trip apart) and 1 % of it is lost;
2. a collector cut off from the coordinator, but not from Redis, for 20 s;
3. the learner cut off from Redis for 10 s;
4. the coordinator cut off from everyone for 10 s.

Partitions are silent (packets dropped, not refused), so every client meets timeouts and
stalled connections, not errors. After each fault heals the role it hit must make progress
again (its recovery time is measured from the heal), and then every worker must; throughout,
the ledger must balance, nothing acknowledged may be lost, policy versions may only go up,
and no role may exit; at the end the run must reach its stop value, with the links still
shaped. Evaluations are held back until well after the last fault, so every fault happens.

The workload is CartPole with PPO (`configs/cartpole-ppo.yaml`; `RLFLEET_NETNS_CONFIG` names
another, say `configs/cartpole-dqn.yaml`). The faults take tens of thousands of env steps on
a 2-core machine, so evaluations must wait until past them. PPO keeps what it learned and
solves at the first evaluations after that; DQN with this config solves early and then mostly
evaluates far below its stop value between lucky 500s, so held back past the faults it solves
much later, and the test takes longer. PPO also puts more of the ledger to work: chunks
consumed, dropped as too stale, and handed out again.

The recovery times are printed (`netns recovery: {...}`, shown with `pytest -s`) and written
as JSON to the file that line names (`RLFLEET_NETNS_REPORT`, or the test's tmp dir).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from integration.helpers import REPO, _merge, wait_for

from rlfleet.shared.infra.storage.redis_store import RedisStorage

from .hosts import COORDINATOR_PORT, REDIS_PORT, Cluster, Net, Watch, unavailable

UNAVAILABLE = unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"hosts apart: {UNAVAILABLE}")

DELAY_MS = 50.0  # on every host's link: two hosts are twice this apart
LOSS = 0.01
COLLECTOR_CUT_S = 20.0
LEARNER_CUT_S = 10.0
COORDINATOR_CUT_S = 10.0
PROGRESS_WITHIN_S = 60.0  # after a heal, every worker moves on within this: none hangs
# Env steps: no evaluation before this, so the run cannot be solved before the last fault
# (each fault is checked to start before it).
FIRST_EVAL = 55_000
CONFIG = Path(os.environ.get("RLFLEET_NETNS_CONFIG", str(REPO / "configs" /
                                                         "cartpole-ppo.yaml")))
# The run's own limit (unsolved by then, it stops and the test fails): DQN needs longer.
MAX_WALL_S = 300 if yaml.safe_load(CONFIG.read_text())["algo"]["name"] == "dqn" else 180
HOSTS = {"redis": 2, "coordinator": 3, "learner": 4, "collector-1": 5, "collector-2": 6}
COLLECTORS = ("collector-1", "collector-2")


def netns_config(path: Path, storage: str) -> Path:
    data = yaml.safe_load(CONFIG.read_text())
    data = _merge(data, {
        "storage": storage,
        # Fast failure detection and frequent snapshots, as in the chaos suite; chunks a
        # cut-off collector wrote but could not announce are reaped within the 20 s cut.
        "coordinator": {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3.0,
                        "snapshot_interval_s": 2.0, "gc_interval_s": 2.0,
                        "orphan_grace_s": 10.0},
        # Evaluations often once allowed: a run that can be solved is seen to be soon.
        "eval": {"start_env_steps": FIRST_EVAL, "every_env_steps": 1000},
        "collector": {"max_held_chunks": 16},
        "stop": {"max_wall_s": MAX_WALL_S},
    })
    if data["algo"]["name"] == "dqn":
        # 100 ms between hosts: fewer, larger round trips. Each sample request carries more
        # batches, and the learner publishes (several round trips to Redis, inside its
        # training loop) and reports less often.
        data = _merge(data, {"learner": {"batches_per_request": 128, "publish_every": 250,
                                         "learn_info_interval_s": 0.5},
                             "collector": {"policy_check_interval_s": 0.25}})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def net(tmp_path):
    """The hosts, torn down whatever happened; every role must also have stopped on its
    own SIGTERM (a hang at shutdown is a hang too)."""
    net = Net(tmp_path)
    try:
        yield net.start()
    finally:
        stubborn = net.close()
    assert not net.remaining(), f"namespaces left: {net.remaining()}"
    assert not net.leftovers(), f"processes left: {net.leftovers()}"
    assert not stubborn, f"did not stop on SIGTERM within the grace period: {stubborn}"


# -- what the test waits for -------------------------------------------------------------------

def counters(cluster: Cluster) -> dict:
    return cluster.status()["counters"]


def accepted(status: dict, worker_id: str) -> int:
    w = next(w for w in status["workers"] if w["worker_id"] == worker_id)
    return w["chunks_accepted"]


def no_exits(cluster: Cluster, when: str) -> None:
    exited = cluster.exited()
    assert not exited, f"{when}: roles exited: {exited}"


def all_alive(cluster: Cluster) -> dict:
    s = cluster.status()
    alive = {w["worker_id"] for w in s["workers"] if w["state"] == "alive"}
    return s if {"learner", *COLLECTORS} <= alive else {}


def stopped(cluster: Cluster) -> dict:
    s = cluster.status()
    return s if s["run"]["state"] == "stopped" else {}


def every_worker_moves(cluster: Cluster, what: str) -> float:
    """Each collector gets chunks accepted and the learner trains, from now on: no worker
    hangs after `what`. Returns the seconds it took."""
    t0 = time.monotonic()
    s = wait_for(lambda: all_alive(cluster), PROGRESS_WITHIN_S,
                 f"every worker alive after {what}")
    before = {c: accepted(s, c) for c in COLLECTORS}
    iterations = s["counters"]["train_iterations"]

    def moved() -> bool:
        no_exits(cluster, what)
        s = cluster.status()
        return (all(accepted(s, c) > n for c, n in before.items())
                and s["counters"]["train_iterations"] > iterations)

    wait_for(moved, PROGRESS_WITHIN_S - (time.monotonic() - t0),
             f"every worker to make progress after {what}", interval=0.2)
    return time.monotonic() - t0


def recovered(cluster: Cluster, healed_at: float, what: str, predicate) -> float:
    """Seconds from the heal until `predicate` (progress through the role the fault hit)
    first holds."""
    def check():
        no_exits(cluster, what)
        return predicate()

    wait_for(check, PROGRESS_WITHIN_S, f"progress after {what}", interval=0.1)
    return round(time.monotonic() - healed_at, 2)


def hold(seconds: float, since: float) -> None:
    """The fault's own duration: nothing to wait for, it is the fault."""
    time.sleep(max(0.0, since + seconds - time.monotonic()))


def assert_partitioned(cluster: Cluster, src: str, dst: str, port: int) -> None:
    host, peer = cluster.net.hosts[src], cluster.net.hosts[dst]
    assert host.handshake_s(peer.ip, port, timeout=1.0) is None, f"{src} still reaches {dst}"


def assert_reaches(cluster: Cluster, src: str, dst: str, port: int) -> None:
    host, peer = cluster.net.hosts[src], cluster.net.hosts[dst]
    # Up to three handshakes: a lost SYN (1 % of packets) is retransmitted only after 1 s.
    assert any(host.handshake_s(peer.ip, port, timeout=3.0) is not None for _ in range(3)), \
        f"{src} does not reach {dst}"


# -- the faults ----------------------------------------------------------------------------------

def cut_collector_from_coordinator(cluster: Cluster, victim: str) -> float:
    net = cluster.net
    net.cut(net.hosts[victim], [cluster.coordinator])
    t_cut = time.monotonic()
    assert_partitioned(cluster, victim, "coordinator", COORDINATOR_PORT)
    assert_reaches(cluster, victim, "redis", REDIS_PORT)
    # The coordinator stops hearing from it, and says so.
    wait_for(lambda: cluster.worker(cluster.status(), victim)["state"] != "alive",
             COLLECTOR_CUT_S, f"the coordinator to notice {victim} is gone")
    hold(COLLECTOR_CUT_S, t_cut)
    before = accepted(cluster.status(), victim)
    net.heal()
    healed = time.monotonic()

    def reports_again() -> bool:
        s = all_alive(cluster)
        return bool(s) and accepted(s, victim) > before

    return recovered(cluster, healed, f"{victim} cut from the coordinator", reports_again)


def cut_learner_from_redis(cluster: Cluster) -> float:
    net = cluster.net
    published = cluster.own_status("learner")["policy_version"]
    net.cut(net.hosts["learner"], [cluster.redis])
    t_cut = time.monotonic()
    assert_partitioned(cluster, "learner", "redis", REDIS_PORT)
    assert_reaches(cluster, "learner", "coordinator", COORDINATOR_PORT)
    hold(LEARNER_CUT_S, t_cut)
    # Nothing new was published meanwhile (a publish already on the wire may have landed).
    # Asked of the learner itself, on its host: the coordinator hears of versions later.
    during = cluster.own_status("learner")["policy_version"]
    assert during <= published + 1, f"the learner published {during - published} " \
        f"versions while cut off from Redis"
    net.heal()
    healed = time.monotonic()
    # Recovered once the run knows of a version the learner published after the heal.
    return recovered(cluster, healed, "the learner cut from Redis",
                     lambda: counters(cluster)["policy_version"] > during)


def cut_coordinator_from_everyone(cluster: Cluster) -> float:
    net = cluster.net
    others = [h for name, h in net.hosts.items() if name != "coordinator"]
    acknowledged = cluster.status()["ledger"]["acknowledged"]
    net.cut(cluster.coordinator, others)
    t_cut = time.monotonic()
    assert_partitioned(cluster, "coordinator", "redis", REDIS_PORT)
    assert_partitioned(cluster, "collector-2", "coordinator", COORDINATOR_PORT)
    # Alone, it hears from no worker and marks every one dead: its scheduler does not wait
    # on storage, which it cannot reach either.
    wait_for(lambda: not any(w["state"] == "alive" for w in cluster.status()["workers"]),
             COORDINATOR_CUT_S, "the coordinator to find every worker gone")
    hold(COORDINATOR_CUT_S, t_cut)
    c = counters(cluster)
    net.heal()
    healed = time.monotonic()

    def counts_again() -> bool:
        now = counters(cluster)
        return (now["env_steps"] > c["env_steps"]
                and now["train_iterations"] > c["train_iterations"])

    took = recovered(cluster, healed, "the coordinator cut from everyone", counts_again)
    assert cluster.status()["ledger"]["acknowledged"] >= acknowledged
    return took


# -- nothing acknowledged is lost ------------------------------------------------------------

def chunks_missing_from_storage(cluster: Cluster, run_name: str) -> dict[str, list[str]]:
    """Every chunk a buffer holds must still be in Redis: asked from the Redis host, with
    the backend's own key scheme."""
    missing = {}
    for name in cluster.get("/buffers")["buffers"]:
        ids = cluster.get(f"/buffers/{name}/chunks")["chunk_ids"]
        with cluster.redis.inside():
            store = RedisStorage(cluster.storage, namespace=run_name, retry_s=5)
            try:
                pipe = store.client.pipeline(transaction=False)
                for chunk_id in ids:
                    pipe.exists(store.key_chunk(chunk_id))
                found = pipe.execute()
            finally:
                store.close()
        gone = [c for c, n in zip(ids, found, strict=True) if not n]
        if gone:
            missing[name] = gone[:5] + ([f"... {len(gone)} in all"] if len(gone) > 5 else [])
    return missing


# -- the suite ---------------------------------------------------------------------------------

@pytest.mark.timeout(MAX_WALL_S + 60)
def test_a_cluster_of_hosts_apart_rides_out_latency_loss_and_partitions(net, tmp_path):
    for name, octet in HOSTS.items():
        net.add_host(name, octet)
    shaping = net.shape(DELAY_MS, LOSS)
    cluster = Cluster(net, token=os.urandom(16).hex())
    config = netns_config(tmp_path / "netns.yaml", cluster.storage)
    run_name = yaml.safe_load(config.read_text())["name"]
    cluster.start_redis()
    # The links are shaped: a handshake between two hosts takes a round trip of 2 x delay.
    rtt = cluster.coordinator.handshake_s(cluster.redis.ip, REDIS_PORT)
    assert rtt is not None and rtt >= 2 * DELAY_MS / 1000 * 0.9, (shaping, rtt)
    cluster.start_coordinator(config, tmp_path / "run")
    cluster.start_worker("learner", "learner")
    for collector in COLLECTORS:
        cluster.start_worker("collector", collector)
    monitor = Watch(cluster)
    ledger: dict = {}
    recovery: dict[str, float] = {}
    moving: dict[str, float] = {}
    timeline: dict[str, dict] = {}  # env steps and seconds since the start, by moment
    started = time.monotonic()

    def mark(moment: str) -> None:
        timeline[moment] = {"env_steps": counters(cluster)["env_steps"],
                            "s": round(time.monotonic() - started, 1)}
    try:
        wait_for(lambda: all_alive(cluster), 120, "the learner and both collectors to join")
        monitor.start()
        wait_for(lambda: counters(cluster)["policy_version"] >= 1, 120,
                 "the first policy version")
        moving["start"] = round(every_worker_moves(cluster, "the start"), 2)

        faults = [("collector cut from coordinator",
                   lambda: cut_collector_from_coordinator(cluster, "collector-1")),
                  ("learner cut from redis", lambda: cut_learner_from_redis(cluster)),
                  ("coordinator cut from everyone",
                   lambda: cut_coordinator_from_everyone(cluster))]
        for fault, inject in faults:
            env_steps = counters(cluster)["env_steps"]
            assert env_steps < FIRST_EVAL, f"env step {env_steps} before the fault " \
                f"'{fault}': the run could be solved before every fault happened"
            mark(fault)
            recovery[fault] = inject()
            moving[fault] = round(every_worker_moves(cluster, fault), 2)
        mark("faults done")

        s = wait_for(lambda: stopped(cluster), MAX_WALL_S, "the run to stop", interval=0.5)
        mark("stopped")
        ledger = s["ledger"]
        no_exits(cluster, "the run")
        assert s["run"]["solved"], f"not solved: {s['run']}, last evaluation " \
            f"{s['latest_evaluation']}"
        assert s["latest_evaluation"]["env_steps"] > timeline["faults done"]["env_steps"]
        assert not chunks_missing_from_storage(cluster, run_name)
    finally:
        monitor.stop.set()
        report = {"shaping": shaping, "delay_ms_per_link": DELAY_MS, "loss_per_link": LOSS,
                  "recovery_s": recovery, "every_worker_moving_s": moving,
                  "timeline": timeline, "ledger_at_stop": ledger}
        out = Path(os.environ.get("RLFLEET_NETNS_REPORT", str(tmp_path / "recovery.json")))
        out.write_text(json.dumps(report, indent=2))
        print(f"\nnetns recovery: {json.dumps(report)} (written to {out})")
    assert not monitor.violations, monitor.violations[:5]
    assert monitor.answers > 50 and monitor.chunk_checks > 5, (monitor.answers,
                                                                monitor.chunk_checks)
