"""Items/s of the prioritized replay buffer's three hot calls, each beside plain numpy.

On a 1,000,000-item `PrioritizedBuffer` (alpha 0.6, beta 0.4):

- insert: chunks of 1,000 items, each a `ChunkInfo` with a unique id; the first fill (empty
  to full, on fresh buffers) and the steady state (inserting into the full buffer, where
  each chunk overwrites the oldest one and releases it).
  Baseline: the same 7 per-item arrays (uid, chunk, row, inserted_at, version, uses,
  priority) written by slice into preallocated numpy arrays, per 1,000-item chunk.
- sample: a learner's request (32 batches of 64 per call) and one 4,096-item batch.
  Baseline: `Generator.choice(N, size=n, p=probs)` with a precomputed normalised
  probability vector (naive prioritized replay, O(N) per call), and `Generator.integers`
  (uniform replay).
- priority update: 2,048 live item ids per call (taken from samples), random priorities;
  and one bulk update of every live id, once.
  Baseline: fancy-index assignment `prio[ids] = values`, on slot numbers (the buffer maps
  item ids to slots, and ignores ids whose slot was refilled, itself).

Every figure is the same work in the same process on the same machine, timed with
`time.perf_counter` over a fixed wall budget after one warm-up call (the first fill: whole
fills on fresh buffers until the budget is spent; the bulk update: one call).

    python -m bench.buffer [--seconds 1.5] [--capacity 1000000] [--seed 0] [--short]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rich.markup import escape
from rich.table import Table

from bench.common import fmt, log, parse_args, ratio, report, rounded, run_main
from rlfleet.shared.replay.buffers.base import ChunkInfo
from rlfleet.shared.replay.buffers.ring import PrioritizedBuffer

ALPHA = 0.6
BETA = 0.4
CHUNK = 1_000               # items per inserted chunk
BATCH, BATCHES = 64, 32     # a learner's sample request
LARGE_BATCH = 4_096         # one large single-batch request
UPDATE_IDS = 2_048          # ids per priority update (one request's worth)
POOL = 64                   # pre-drawn id / priority sets the update loops cycle through
SAMPLE_GOAL = 200_000       # prioritized sample items/s the team aims for

FIGURES = ("insert_items_per_s", "prioritized_sample_items_per_s", "priority_update_items_per_s",
           "baseline_insert_items_per_s", "baseline_sample_items_per_s",
           "baseline_update_items_per_s", "fill_items_per_s", "baseline_fill_items_per_s",
           "prioritized_sample_4096_items_per_s", "baseline_sample_4096_items_per_s",
           "baseline_uniform_sample_items_per_s", "bulk_priority_update_items_per_s")
# The smallest buffer the bench allows (64 chunks) and a tenth of a second a figure.
SHORT = {"seconds": 0.1, "capacity": 64 * CHUNK}


@dataclass
class Timing:
    """`calls` calls of `items` items each over `seconds` of wall time."""

    items: int
    calls: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.items * self.calls / self.seconds

    @property
    def us_per_call(self) -> float:
        return 1e6 * self.seconds / self.calls


def timed(call: Callable[[int], object], items: int, budget: float,
          warmup: bool = True) -> Timing:
    """Call `call(i)` (i = 0, 1, ...) until `budget` seconds have passed; call 0 is a
    warm-up, not timed, unless `warmup` is False."""
    i = 0
    if warmup:
        call(i)
        i += 1
    first = i
    t0 = time.perf_counter()
    while True:
        call(i)
        i += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= budget:
            return Timing(items, i - first, elapsed)


def new_buffer(capacity: int, seed: int) -> PrioritizedBuffer:
    return PrioritizedBuffer("bench", capacity, seed, alpha=ALPHA, beta=BETA)


def chunk_info(k: int) -> ChunkInfo:
    return ChunkInfo(chunk_id=f"chunk-{k:09d}", length=CHUNK, policy_version=k // 100)


# -- insert -------------------------------------------------------------------------------

def fill_buffer(buf: PrioritizedBuffer, start: int) -> int:
    """Insert chunks from number `start` until the buffer is full; returns the next number."""
    k = start
    while len(buf) < buf.capacity:
        buf.insert([chunk_info(k)], k // 10)
        k += 1
    return k


def bench_fill(capacity: int, seed: int, budget: float) -> tuple[Timing, PrioritizedBuffer]:
    """Whole fills (empty -> full) on fresh buffers until the budget is spent; buffer
    construction is not timed. Returns the last (full) buffer for the other figures."""
    fill_buffer(new_buffer(min(capacity, 20 * CHUNK), seed), 0)  # warm-up, small
    fills, seconds = 0, 0.0
    while True:
        buf = new_buffer(capacity, seed)
        t0 = time.perf_counter()
        fill_buffer(buf, 0)
        seconds += time.perf_counter() - t0
        fills += 1
        if seconds >= budget:
            return Timing(CHUNK, capacity // CHUNK * fills, seconds), buf


class NumpyRing:
    """The floor for an insert: the 7 per-item arrays written by slice."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.uid = np.zeros(capacity, dtype=np.int64)
        self.chunk = np.zeros(capacity, dtype=np.int32)
        self.row = np.zeros(capacity, dtype=np.int32)
        self.inserted_at = np.zeros(capacity, dtype=np.int64)
        self.version = np.zeros(capacity, dtype=np.int64)
        self.uses = np.zeros(capacity, dtype=np.int32)
        self.priority = np.zeros(capacity, dtype=np.float64)
        self.rows = np.arange(CHUNK, dtype=np.int32)
        self.next_uid = 0

    def insert(self, k: int) -> None:
        start = self.next_uid % self.capacity
        end = start + CHUNK
        self.uid[start:end] = self.next_uid + self.rows
        self.chunk[start:end] = k % (self.capacity // CHUNK)
        self.row[start:end] = self.rows
        self.inserted_at[start:end] = k // 10
        self.version[start:end] = k // 100
        self.uses[start:end] = 0
        self.priority[start:end] = 1.0
        self.next_uid += CHUNK


def bench_baseline_fill(capacity: int, budget: float) -> Timing:
    calls = capacity // CHUNK
    warm = NumpyRing(20 * CHUNK)
    for k in range(20):
        warm.insert(k)
    fills, seconds = 0, 0.0
    while seconds < budget:
        ring = NumpyRing(capacity)  # fresh arrays, as a fresh buffer has
        t0 = time.perf_counter()
        for k in range(calls):
            ring.insert(k)
        seconds += time.perf_counter() - t0
        fills += 1
    return Timing(CHUNK, calls * fills, seconds)


# -- main ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=1.5, help="wall budget of each figure")
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=0)
    args = parse_args(p, argv, SHORT)
    if args.capacity % CHUNK or args.capacity < 64 * CHUNK:
        p.error(f"--capacity must be a multiple of {CHUNK} and at least {64 * CHUNK}")
    n, budget = args.capacity, args.seconds
    rng = np.random.default_rng(args.seed)
    base_rng = np.random.default_rng(args.seed + 1)
    t_start = time.perf_counter()

    # insert: first fill, then the steady state on the full buffer
    log(f"insert: first fill of {n:,} items in {CHUNK:,}-item chunks...")
    fill, buf = bench_fill(n, args.seed, budget)
    base_fill = bench_baseline_fill(n, budget)

    log("insert: steady state (full buffer, each chunk releases the oldest)...")
    next_chunk = n // CHUNK
    released = 0

    def insert(i: int) -> None:
        nonlocal released
        k = next_chunk + i
        released += len(buf.insert([chunk_info(k)], k // 10))

    steady = timed(insert, CHUNK, budget)
    if released != steady.calls + 1:  # warm-up included: one release per chunk
        raise RuntimeError(f"{steady.calls + 1} inserts into a full buffer released "
                           f"{released} chunks, not one each")
    ring = NumpyRing(n)
    for k in range(n // CHUNK):  # touch every page first: the steady state's arrays are warm
        ring.insert(k)
    base_steady = timed(lambda i: ring.insert(next_chunk + i), CHUNK, budget)
    assert len(buf) == n

    # bulk priority update first, so the sampling figures see varied priorities
    log("priority update: one bulk update of every live id...")
    live = buf.uid.copy()
    bulk_prio = rng.exponential(1.0, size=n)
    t0 = time.perf_counter()
    applied = buf.update_priorities(live, bulk_prio)
    bulk = Timing(n, 1, time.perf_counter() - t0)
    if applied != n:
        raise RuntimeError(f"bulk update applied {applied} of {n} priorities")
    prio = np.zeros(n, dtype=np.float64)
    live_slots = live % n  # the baseline indexes by slot; the buffer maps ids to slots
    t0 = time.perf_counter()
    prio[live_slots] = bulk_prio
    base_bulk = Timing(n, 1, time.perf_counter() - t0)

    # sample: the same distribution for the buffer and the naive baseline
    probs = (bulk_prio + buf.eps) ** ALPHA
    probs /= probs.sum()
    log(f"sample: {BATCHES} x {BATCH} per call...")
    iteration = 0

    def sample(batch_size: int, num_batches: int) -> Callable[[int], object]:
        def call(i: int) -> object:
            nonlocal iteration
            iteration += 1
            return buf.sample(batch_size, num_batches, iteration, iteration // 10)
        return call

    per_request = BATCH * BATCHES
    sample_req = timed(sample(BATCH, BATCHES), per_request, budget)
    base_choice = timed(lambda i: base_rng.choice(n, size=per_request, p=probs),
                        per_request, budget)
    base_uniform = timed(lambda i: base_rng.integers(n, size=per_request), per_request, budget)
    log(f"sample: {LARGE_BATCH:,} x 1 per call...")
    sample_large = timed(sample(LARGE_BATCH, 1), LARGE_BATCH, budget)
    base_choice_large = timed(lambda i: base_rng.choice(n, size=LARGE_BATCH, p=probs),
                              LARGE_BATCH, budget)

    # priority updates of live ids, as a learner sends them after a request
    log(f"priority update: {UPDATE_IDS:,} ids per call...")
    ids = np.stack([buf.sample(UPDATE_IDS, 1, iteration, -1).item_ids.reshape(-1)
                    for _ in range(POOL)])
    values = rng.exponential(1.0, size=ids.shape)
    if buf.update_priorities(ids[0], values[0]) != UPDATE_IDS:
        raise RuntimeError("priority update ids are not all live")
    update = timed(lambda i: buf.update_priorities(ids[i % POOL], values[i % POOL]),
                   UPDATE_IDS, budget)

    slots = ids % n

    def base_update(i: int) -> None:
        prio[slots[i % POOL]] = values[i % POOL]

    base_upd = timed(base_update, UPDATE_IDS, budget)
    log(f"done in {time.perf_counter() - t_start:.1f} s")

    # -- output ---------------------------------------------------------------------------
    t = Table(title=f"PrioritizedBuffer ({n:,} items, alpha {ALPHA}, beta {BETA}) beside "
                    f"plain numpy, ~{budget:g} s per figure",
              caption="ratio: PrioritizedBuffer items/s over the baseline's (above 1: the "
                      "buffer is faster). Insert baselines write the 7 per-item arrays by "
                      "slice into preallocated arrays (fresh ones for the first fill); the "
                      "first fill times whole fills of fresh buffers, the bulk update is one "
                      "call, every other figure runs for the budget after a warm-up call. "
                      f"Goal: prioritized sample >= {SAMPLE_GOAL:,} items/s.")
    for name, justify in (("operation", "left"), ("per call", "right"),
                          ("PrioritizedBuffer items/s", "right"), ("us/call", "right"),
                          ("baseline", "left"), ("baseline items/s", "right"),
                          ("ratio", "right")):
        t.add_column(name, justify=justify)

    def row(operation: str, per_call: str, ours: Timing | None, label: str,
            base: Timing) -> None:
        t.add_row(operation, per_call,
                  fmt(ours.per_s if ours else None, ",.0f"),
                  fmt(ours.us_per_call if ours else None, ",.1f"), escape(label),
                  fmt(base.per_s, ",.0f"),
                  fmt(ratio(ours.per_s, base.per_s) if ours else None, ".2f"))

    row("insert: first fill", f"{CHUNK:,} items", fill, "7 slice writes, fresh", base_fill)
    row("insert: steady state", f"{CHUNK:,} items", steady, "7 slice writes", base_steady)
    t.add_section()
    choice = "rng.choice(N, n, p=probs)"
    row("sample: learner request", f"{BATCHES} x {BATCH}", sample_req, choice, base_choice)
    row("", "", None, "rng.integers(N, n) (uniform)", base_uniform)
    row("sample: one large batch", f"{LARGE_BATCH:,} x 1", sample_large, choice,
        base_choice_large)
    t.add_section()
    row("priority update", f"{UPDATE_IDS:,} ids", update, "prio[ids] = values", base_upd)
    row("priority update: bulk, once", f"{n:,} ids", bulk, "prio[ids] = values", base_bulk)

    result = {
        "insert_items_per_s": rounded(steady.per_s, 0),
        "prioritized_sample_items_per_s": rounded(sample_req.per_s, 0),
        "priority_update_items_per_s": rounded(update.per_s, 0),
        "baseline_insert_items_per_s": rounded(base_steady.per_s, 0),
        "baseline_sample_items_per_s": rounded(base_choice.per_s, 0),
        "baseline_update_items_per_s": rounded(base_upd.per_s, 0),
        "fill_items_per_s": rounded(fill.per_s, 0),
        "baseline_fill_items_per_s": rounded(base_fill.per_s, 0),
        "prioritized_sample_4096_items_per_s": rounded(sample_large.per_s, 0),
        "baseline_sample_4096_items_per_s": rounded(base_choice_large.per_s, 0),
        "baseline_uniform_sample_items_per_s": rounded(base_uniform.per_s, 0),
        "bulk_priority_update_items_per_s": rounded(bulk.per_s, 0),
        "capacity": n,
        "goal_sample_items_per_s": SAMPLE_GOAL,
    }
    report(result, t)
    return 0


if __name__ == "__main__":
    run_main(main)
