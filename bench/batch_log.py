"""What the batch log (`logging.batch_log`) costs, beside the work it rides on.

In one process, on the same machine, in rounds (the figures are the rounds' medians, with
their spread):

- coordinator: a learner's sample request (64 batches of 64 from a full uniform buffer of
  `--capacity` items), `buffer.sample` alone (the ceiling: what the request costs without the
  batch log) and followed by what the batch log adds under the coordinator's lock (queueing
  the items, `BatchLog.on_sample`); and the counting of a request's items that the
  scheduler's tick does outside the lock (`BatchLog.count_queued`);
- coordinator: one flush of a full count table (`unique_in_memory` items) to samples.jsonl:
  the part under the lock (`take_rows`) and the write outside it;
- learner: logging one update's samples (`BatchLogTaker.take`: 256 samples, two values)
  beside the DQN update it follows (CartPole's network, batch 256): with
  `every_train_iterations: 100`, one update in 100 pays it.

    python -m bench.batch_log [--seconds 1.0] [--rounds 3] [--unique 262144]
                              [--capacity 100000] [--short]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from rich.table import Table

from bench.common import REPO_ROOT, fmt, log, parse_args, report, rounded, run_main
from rlfleet.coordinator.batch_log import BatchLog
from rlfleet.learner.observe.batch_log import BatchLogTaker
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.batching.batching import Batch
from rlfleet.shared.contract.config import BatchLogConfig
from rlfleet.shared.envs.make import run_spec
from rlfleet.shared.replay.buffers.base import ChunkInfo
from rlfleet.shared.replay.buffers.ring import UniformBuffer
from rlfleet.shared.run.config import load_config

CHUNK = 128
BATCH, BATCHES = 64, 64          # a learner's sample request (configs/cartpole-dqn.yaml)
LOGGED, UPDATE_BATCH = 256, 256  # samples logged per logged update; the update's batch

FIGURES = ("sample_us", "queue_us", "sample_with_counts_us", "counting_overhead", "count_us",
           "flush_take_ms",
           "flush_write_ms", "update_us", "take_us", "take_per_update_share")
SHORT = {"seconds": 0.1, "rounds": 1, "unique": 4096, "capacity": 8192}


def per_call_us(call: Callable[[int], object], budget: float) -> float:
    """Microseconds per `call(i)` over `budget` seconds, after one untimed call."""
    call(0)
    i, t0 = 1, time.perf_counter()
    while True:
        call(i)
        i += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= budget:
            return 1e6 * elapsed / (i - 1)


def coordinator_round(budget: float, capacity: int, unique: int, seed: int
                      ) -> dict[str, float]:
    buf = UniformBuffer("replay", capacity, seed)
    buf.insert([ChunkInfo(f"c{k}", CHUNK, 0) for k in range(capacity // CHUNK + 1)], 0)
    requests = [buf.sample(BATCH, BATCHES, i, 0).item_ids for i in range(64)]
    with tempfile.TemporaryDirectory(prefix="rlfleet-bench-batch-log-") as run_dir:
        blog = BatchLog(BatchLogConfig(unique_in_memory=unique, max_mb=None), Path(run_dir))
        plain = per_call_us(lambda i: buf.sample(BATCH, BATCHES, i, 0), budget)
        # under the lock: queueing a request's items, 64 requests at a time (a tick's
        # worth), the queue drained by the tick between them, untimed
        queued_s, calls, end = 0.0, 0, time.perf_counter() + budget
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            for i, ids in enumerate(requests):
                blog.on_sample("replay", ids, i)
            queued_s += time.perf_counter() - t0
            calls += len(requests)
            blog.count_queued()

        def counted(i: int) -> None:  # the scheduler's tick, outside the lock
            blog.on_sample("replay", requests[i % len(requests)], i)
            blog.count_queued()
        count = per_call_us(counted, budget)
        blog.take_rows()  # what the timings pushed out: not the flush measured below
        # a full table: every slot holds an item with unflushed counts
        blog.on_sample("replay", np.arange(unique, dtype=np.int64), 1)
        t0 = time.perf_counter()
        rows = blog.take_rows()
        t1 = time.perf_counter()
        blog.write_samples(rows)
        t2 = time.perf_counter()
        blog.close()
    return {"sample_us": plain, "queue_us": 1e6 * queued_s / calls, "count_us": count,
            "flush_take_ms": 1e3 * (t1 - t0), "flush_write_ms": 1e3 * (t2 - t1)}


def learner_round(budget: float, seed: int) -> dict[str, float]:
    cfg = load_config(REPO_ROOT / "configs" / "cartpole-dqn.yaml")
    policy = make_policy(cfg.algo, run_spec(cfg), seed)
    rng = np.random.default_rng(seed)
    data = {"obs": torch.as_tensor(rng.normal(size=(UPDATE_BATCH, 4)), dtype=torch.float32),
            "next_obs": torch.as_tensor(rng.normal(size=(UPDATE_BATCH, 4)),
                                        dtype=torch.float32),
            "action": torch.as_tensor(rng.integers(0, 2, UPDATE_BATCH)),
            "reward": torch.ones(UPDATE_BATCH),
            "terminated": torch.zeros(UPDATE_BATCH, dtype=torch.bool),
            "truncated": torch.zeros(UPDATE_BATCH, dtype=torch.bool)}
    batch = Batch(data, samples=[("replay", np.arange(UPDATE_BATCH, dtype=np.int64),
                                  slice(0, UPDATE_BATCH))])
    out = policy.learn(data)
    update = per_call_us(lambda i: policy.learn(data), budget)
    taker = BatchLogTaker(BatchLogConfig(every_train_iterations=1,
                                         samples_per_update=LOGGED))

    def take(i: int) -> None:
        taker.take(i, batch, out.sample_values)
        taker.take_pending()
    return {"update_us": update, "take_us": per_call_us(take, budget)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=1.0, help="wall budget of each timing")
    p.add_argument("--rounds", type=int, default=3, help="rounds; figures are their medians")
    p.add_argument("--unique", type=int, default=262_144,
                   help="logging.batch_log.unique_in_memory of the counts' table")
    p.add_argument("--capacity", type=int, default=100_000, help="items in the buffer")
    p.add_argument("--seed", type=int, default=0)
    args = parse_args(p, argv, SHORT)
    torch.set_num_threads(1)
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        log(f"round {r + 1} of {args.rounds}...")
        rounds.append({**coordinator_round(args.seconds, args.capacity, args.unique,
                                           args.seed + r),
                       **learner_round(args.seconds, args.seed + r)})

    def med(key: str) -> float:
        return float(statistics.median(x[key] for x in rounds))

    def spread(key: str) -> str:
        values = [x[key] for x in rounds]
        digits = 2 if max(values) < 10 else 1
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}"

    result = {k: med(k) for k in rounds[0]}
    result["sample_with_counts_us"] = result["sample_us"] + result["queue_us"]
    result["counting_overhead"] = result["queue_us"] / result["sample_us"]
    result["take_per_update_share"] = result["take_us"] / 100 / result["update_us"]
    table = Table(title=f"batch log costs ({args.rounds} rounds: median, spread)")
    table.add_column("what")
    table.add_column("median", justify="right")
    table.add_column("spread", justify="right")
    table.add_column("beside", justify="right")
    table.add_row(f"sample request ({BATCHES}x{BATCH} of {args.capacity:,}), us",
                  fmt(result["sample_us"]),
                  spread("sample_us"), "the ceiling")
    table.add_row("queueing its items for the batch log (under the lock), us",
                  fmt(result["queue_us"], ".2f"), spread("queue_us"),
                  f"+{100 * result['counting_overhead']:.1f}%")
    table.add_row("counting a request's items (the tick, outside the lock), us",
                  fmt(result["count_us"]), spread("count_us"),
                  f"{result['count_us'] / result['sample_us']:.2f}x the sample")
    table.add_row(f"flush of a full table ({args.unique:,} items): taking it, ms",
                  fmt(result["flush_take_ms"]), spread("flush_take_ms"), "")
    table.add_row("... writing it to samples.jsonl, ms", fmt(result["flush_write_ms"]),
                  spread("flush_write_ms"), "")
    table.add_row(f"DQN update (batch {UPDATE_BATCH}), us", fmt(result["update_us"]),
                  spread("update_us"), "the ceiling")
    table.add_row(f"logging {LOGGED} samples of an update, us", fmt(result["take_us"]),
                  spread("take_us"),
                  f"{100 * result['take_per_update_share']:.2f}% of updates at 1 in 100")
    report({k: rounded(result[k], 4) for k in FIGURES}
           | {"rounds": args.rounds, "unique_in_memory": args.unique,
              "capacity": args.capacity}, table)
    return 0


if __name__ == "__main__":
    run_main(main)
