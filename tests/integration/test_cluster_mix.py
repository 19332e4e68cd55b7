"""A real cluster whose learner draws each batch from two buffers: half uniform, half
prioritized. One coordinator, one collector and one learner (each `python -m rlfleet`),
directory storage, until a small env-step budget runs out.

What only a whole cluster shows: the learner's |TD errors| come back as priorities over
learn-info and land in the prioritized buffer, both buffers are sampled in their shares of
each batch and held to their rate limits, and storage ends up holding exactly the chunks
some buffer still refers to.
"""

from __future__ import annotations

from pathlib import Path

from rlfleet.shared.contract.codec import decode_arrays
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.storage import DirectoryStorage

from .helpers import Processes, small_config, wait_for

CHUNK_SIZE = 128
MAX_ENV_STEPS = 8_000
LIMIT = {"min_size": 500, "samples_per_insert": 8, "error_buffer": 32_000}


def test_a_mixed_learner_sends_priorities_and_storage_follows_both_buffers(
        processes: Processes, tmp_path: Path):
    config = small_config(
        tmp_path / "config.yaml",
        buffers={"replay": {"kind": "uniform", "capacity": 4096, "rate_limit": LIMIT},
                 "prio": {"kind": "prioritized", "capacity": 2048, "rate_limit": LIMIT}},
        learner={"mix": [{"buffer": "replay", "fraction": 0.5},
                         {"buffer": "prio", "fraction": 0.5}], "torch_threads": 2},
        collector={"chunk_size": CHUNK_SIZE},
        eval={"every_env_steps": 100_000},
        # released chunks are deleted once a snapshot no longer refers to them
        coordinator={"snapshot_interval_s": 2.0},
        stop={"max_env_steps": MAX_ENV_STEPS, "max_wall_s": 100})
    storage_dir = tmp_path / "storage"
    coordinator = processes.start("coordinator", "coordinator", "--config", str(config),
                                  "--run-dir", str(tmp_path / "run"), "--storage",
                                  str(storage_dir))
    coordinator.wait_healthy()
    collector = processes.start("collector", "collector", "--coordinator", coordinator.url,
                                "--worker-id", "c1")
    learner = processes.start("learner", "learner", "--coordinator", coordinator.url,
                              "--worker-id", "l1")

    def status() -> dict:
        return coordinator.get(f"{API}/status")

    wait_for(lambda: status()["run"]["state"] == "stopped", 100,
             f"the run to stop at max_env_steps={MAX_ENV_STEPS}")
    store = DirectoryStorage(storage_dir)

    def quiet() -> bool:
        c, lrn, s = collector.get("/status"), learner.get("/status"), status()
        seen = (f"collector wrote {c['chunks_written']}, reported {c['chunks_reported']}; "
                f"coordinator accepted {s['counters']['chunks_accepted']}, holds "
                f"{s['buffer']['chunks']}; storage {len(store.list_chunks())}; policy "
                f"learner {lrn['policy_version']}, coordinator "
                f"{s['counters']['policy_version']}")
        assert c["chunks_reported"] == c["chunks_written"] == \
            s["counters"]["chunks_accepted"], seen
        assert len(store.list_chunks()) == s["buffer"]["chunks"], seen
        assert lrn["policy_version"] == s["counters"]["policy_version"], seen
        return True

    wait_for(quiet, 30, "every chunk reported, every released chunk deleted")
    s = status()
    assert collector.get("/status")["error"] is None
    learned = learner.get("/status")
    assert learned["error"] is None
    assert learned["torch_threads"] == 2  # learner.torch_threads, applied
    # the training thread's CPU time is a part of its update time, never more
    timers = learned["timers"]
    assert 0 < timers["update_cpu_s"] <= timers["update_s"] + 0.01, timers
    counters, replay, prio = s["counters"], s["buffers"]["replay"], s["buffers"]["prio"]
    assert counters["train_iterations"] > 0
    assert counters["env_steps"] == counters["chunks_accepted"] * CHUNK_SIZE >= MAX_ENV_STEPS

    # the learner's priorities arrived, for items the buffer held (or had just overwritten)
    assert prio["priority_updates"] > 0
    assert prio["priority_updates"] + prio["stale_priority_updates"] <= prio["sampled_items"]
    assert replay["priority_updates"] == 0  # a uniform buffer gets none
    # each batch: 32 items from each buffer, within each buffer's rate limit
    assert replay["sampled_items"] == prio["sampled_items"] == 32 * counters["granted_batches"]
    for b in (replay, prio):
        assert b["inserted_items"] == counters["env_steps"]
        assert b["sampled_items"] <= 8 * (b["inserted_items"] - 500) + 32_000

    # both rings are full and hold whole chunks (128 divides both capacities): storage holds
    # the larger ring's chunks, which include the smaller one's
    assert (replay["size"], prio["size"]) == (4096, 2048)
    assert s["buffer"] == {"size": 4096 + 2048, "chunks": 4096 // CHUNK_SIZE}
    assert replay["released_chunks"] == counters["chunks_accepted"] - 4096 // CHUNK_SIZE
    assert prio["released_chunks"] == counters["chunks_accepted"] - 2048 // CHUNK_SIZE
    blobs = store.get_chunks(store.list_chunks())
    assert sum(len(decode_arrays(blob)[0]["reward"]) for blob in blobs) == 4096

    assert processes.stop_all() == {"learner": 0, "collector": 0, "coordinator": 0}
