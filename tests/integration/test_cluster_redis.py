"""A real cluster on Redis: one coordinator, one collector and one learner, each its own
`python -m rlfleet` process, training CartPole until a small env-step budget runs out.

The run happens once per module (it takes tens of seconds on 2 cores); while it runs, the
fixture samples how many chunks Redis holds next to how many the buffer holds, then waits until
the cluster is quiet. The tests read what it left: coordinator status, worker status, Redis keys.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest

from rlfleet.shared.contract.codec import decode_arrays
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.storage import RedisStorage

from .helpers import (
    REDIS_URL,
    Processes,
    Service,
    requires_redis,
    small_config,
    wait_for,
)

pytestmark = requires_redis

CAPACITY = 2048
CHUNK_SIZE = 128
MAX_ENV_STEPS = 20_000


@dataclass
class Run:
    name: str
    coordinator: Service
    collector: Service
    learner: Service
    storage: RedisStorage
    # (chunks in Redis, chunks in the buffer) sampled while the run was going.
    samples: list[tuple[int, int]] = field(default_factory=list)
    status_while_running: dict | None = None
    collector_status: dict | None = None
    procs: Processes | None = None

    def status(self) -> dict:
        return self.coordinator.get(f"{API}/status")


def _sample(run: Run) -> dict:
    in_redis = run.storage.client.scard(run.storage.key_chunk_index)
    status = run.status()
    run.samples.append((in_redis, status["buffer"]["chunks"]))
    return status


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster-redis")
    name = f"it-redis-{uuid.uuid4().hex[:8]}"
    config = small_config(tmp / "config.yaml", buffers={"replay": {"capacity": CAPACITY}},
                          collector={"chunk_size": CHUNK_SIZE},
                          coordinator={"snapshot_interval_s": 0.25},
                          stop={"max_env_steps": MAX_ENV_STEPS})
    storage = RedisStorage(REDIS_URL, name)
    storage.clear()
    procs = Processes(tmp)
    try:
        coordinator = procs.start("coordinator", "coordinator", "--config", str(config),
                                  "--run-dir", str(tmp / "run"), "--storage", REDIS_URL,
                                  "--name", name)
        coordinator.wait_healthy()
        collector = procs.start("collector", "collector", "--coordinator", coordinator.url,
                                "--worker-id", "c1")
        learner = procs.start("learner", "learner", "--coordinator", coordinator.url,
                              "--worker-id", "l1")
        run = Run(name, coordinator, collector, learner, storage, procs=procs)

        def collecting() -> bool:
            status = _sample(run)
            if status["counters"]["chunks_accepted"] > 0:
                run.status_while_running = status
                return True
            return False

        wait_for(collecting, 60, "the collector's first chunks to reach the coordinator")

        def stopped() -> bool:
            status = _sample(run)
            if status["run"]["state"] == "running" and status["counters"]["env_steps"] > 0:
                run.status_while_running = status
            return status["run"]["state"] == "stopped"

        wait_for(stopped, 150, f"the run to stop at max_env_steps={MAX_ENV_STEPS}")

        # Quiet: the collector announced every chunk it wrote, the janitor deleted every
        # evicted chunk (so Redis holds exactly what the buffer does), and the learner
        # published its last version and reported it.
        def quiet() -> bool:
            c = run.collector.get("/status")
            learner = run.learner.get("/status")
            s = run.status()
            in_redis = storage.client.scard(storage.key_chunk_index)
            latest = storage.latest_version()
            seen = (f"collector wrote {c['chunks_written']}, reported {c['chunks_reported']}; "
                    f"coordinator accepted {s['counters']['chunks_accepted']}, buffer holds "
                    f"{s['buffer']['chunks']}; Redis holds {in_redis}; policy version: "
                    f"learner {learner['policy_version']}, Redis {latest}, coordinator "
                    f"{s['counters']['policy_version']}")
            assert c["chunks_written"] > 0, seen
            assert c["chunks_reported"] == c["chunks_written"], seen
            assert s["counters"]["chunks_accepted"] == c["chunks_written"], seen
            assert in_redis == s["buffer"]["chunks"], seen
            assert learner["policy_version"] == latest == s["counters"]["policy_version"], seen
            run.collector_status = c
            return True

        wait_for(quiet, 30, "every chunk to be reported and every evicted chunk deleted")
        yield run
    finally:
        procs.stop_all()
        storage.clear()
        storage.close()


def test_collector_registered_and_got_a_collect_task(run: Run):
    status = run.status()
    workers = {w["worker_id"]: w for w in status["workers"]}
    assert workers["c1"]["role"] == "collector"
    assert workers["c1"]["registrations"] == 1
    assert workers["l1"]["role"] == "learner"
    # While the run went on, both were alive and running their tasks.
    during = run.status_while_running
    assert during is not None
    assert {w["worker_id"]: w["state"] for w in during["workers"]} == {"c1": "alive",
                                                                       "l1": "alive"}
    assert {(t["kind"], t["worker_id"], t["state"]) for t in during["tasks"]} >= {
        ("collect", "c1", "running"), ("learn", "l1", "running")}
    tasks = run.coordinator.get(f"{API}/tasks")["tasks"]
    collect = [t for t in tasks if t["kind"] == "collect" and t["worker_id"] == "c1"]
    learn = [t for t in tasks if t["kind"] == "learn" and t["worker_id"] == "l1"]
    assert len(collect) == 1 and len(learn) == 1, tasks
    assert collect[0]["state"] in ("running", "finished"), collect
    assert run.collector.get("/status")["task_id"] == collect[0]["task_id"]
    assert run.learner.get("/status")["task_id"] == learn[0]["task_id"]


def test_chunks_went_through_redis_and_were_reported(run: Run):
    status = run.status()
    counters, buffer = status["counters"], status["buffer"]
    replay = status["buffers"]["replay"]
    assert status["run"]["state"] == "stopped"
    assert status["run"]["stop_reason"] == f"max_env_steps={MAX_ENV_STEPS} reached"
    assert status["run"]["storage"] == REDIS_URL
    assert counters["chunks_accepted"] > 0
    assert counters["env_steps"] >= MAX_ENV_STEPS
    assert counters["env_steps"] == counters["chunks_accepted"] * CHUNK_SIZE
    assert counters["episodes"] > 0
    # one buffer: the total is its size; far more went through than the ring holds
    assert buffer["size"] == replay["size"] == replay["capacity"] == CAPACITY
    assert replay["kind"] == "uniform"
    assert replay["inserted_chunks"] == counters["chunks_accepted"]
    assert replay["inserted_items"] == counters["env_steps"]
    assert replay["inserted_items"] - replay["evicted_items"] == replay["size"]

    # The collector wrote what the coordinator accepted: nothing lost, nothing counted twice.
    c = run.collector_status
    assert c["chunks_written"] == c["chunks_reported"] == counters["chunks_accepted"]
    assert c["env_steps"] == counters["env_steps"]
    assert c["error"] is None

    # Redis holds exactly the buffer's chunks: the same count, and their rows add up to the
    # buffer's size (chunks of 128 rows fill the ring of 2048 exactly, so none is held in
    # part); every other chunk ever written was released and deleted.
    ids = run.storage.list_chunks()
    assert len(ids) == buffer["chunks"] == replay["inserted_chunks"] - replay["released_chunks"]
    rows = 0
    for blob in run.storage.get_chunks(ids):
        arrays, meta = decode_arrays(blob)
        assert meta["worker_id"] == "c1"
        rows += len(arrays["reward"])
    assert rows == buffer["size"]
    chunk_keys = list(run.storage.client.scan_iter(match=f"{run.storage.prefix}chunk:*"))
    assert len(chunk_keys) == len(ids), "a chunk value without an index entry leaked"


def test_eviction_deletes_chunks_from_redis(run: Run):
    status = run.status()
    evicted = status["buffers"]["replay"]["released_chunks"]
    ever_written = status["counters"]["chunks_accepted"]
    assert evicted > ever_written // 2, "a capacity this small must have evicted most chunks"
    max_buffer_chunks = max(b for _, b in run.samples)
    assert max_buffer_chunks <= CAPACITY // CHUNK_SIZE + 1
    # Sampled all along the run: Redis never held many more chunks than the buffer (only
    # chunks written but not yet announced, or evicted but not yet deleted: deletion waits
    # for the next snapshot, every 0.25 s here). Without deletion it would have held every
    # chunk ever written.
    most_in_redis = max(r for r, _ in run.samples)
    assert len(run.samples) > 20
    assert most_in_redis <= max_buffer_chunks + 48, (most_in_redis, max_buffer_chunks)
    assert most_in_redis < ever_written // 2


def test_learner_trained_and_published_versions(run: Run):
    status = run.status()
    learner = run.learner.get("/status")
    assert learner["error"] is None
    assert learner["train_iterations"] > 0
    assert status["counters"]["train_iterations"] > 0
    assert status["counters"]["granted_batches"] >= status["counters"]["train_iterations"]
    # the learner never ran ahead of the rate limit: 16 items per item inserted past
    # min_size plus the error buffer, in batches of 64. (Collectors may end further behind
    # the line: chunks already written when the throttle reaches them are still accepted.)
    replay = status["buffers"]["replay"]
    assert replay["sampled_items"] == 64 * status["counters"]["granted_batches"]
    assert replay["sampled_items"] <= 16 * (replay["inserted_items"] - 500) + 64_000
    assert status["train"], "learner metrics reached the coordinator"
    latest = run.storage.latest_version()
    assert latest is not None and latest > 0
    assert latest == learner["policy_version"] == status["counters"]["policy_version"]
    assert learner["train_iterations"] == status["counters"]["train_iterations"]
    assert run.storage.get_weights(latest)[0] == latest
    # Old versions are dropped: only the newest few are kept.
    versions = run.storage.client.zrange(run.storage.key_versions, 0, -1)
    assert 1 <= len(versions) <= run.storage.keep_weight_versions


def test_collector_followed_the_policy(run: Run):
    c = run.collector.get("/status")
    assert c["policy_loads"] > 1
    assert c["policy_version"] > 0
    worker = {w["worker_id"]: w for w in run.status()["workers"]}["c1"]
    assert worker["status"]["env_steps"] > 0


def test_an_evaluation_ran(run: Run):
    status = run.status()
    ev = status["latest_evaluation"]
    assert ev is not None
    assert ev["worker_id"] == "c1"
    assert ev["episodes"] == 4
    assert ev["policy_version"] >= 0
    assert 1 <= ev["return_mean"] <= 500
    assert status["best_evaluation"] is not None
    assert run.collector.get("/status")["evaluations"] >= 1
    evals = run.coordinator.get(f"{API}/evaluations")["evaluations"]
    assert len(evals) >= 1


def test_services_stop_cleanly_on_sigterm(run: Run):
    """Last in the module: SIGTERM ends every service with code 0 and leaves no process."""
    assert run.procs is not None
    codes = run.procs.stop_all()
    assert codes == {"learner": 0, "collector": 0, "coordinator": 0}, (
        codes, run.collector.tail(40), run.learner.tail(40), run.coordinator.tail(40))
    wait_for(lambda: not run.procs.leftovers(), 15, "the cluster's processes to exit")
