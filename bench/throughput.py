"""Throughput of the two hot loops, each beside the same loop run in this process.

(a) Collector: one collector process (coordinator up, no learner, no replay-ratio throttling,
    no evaluations) writes chunks to storage and reports them; its env steps/s come from the
    coordinator's counters over a fixed window. Ceiling: `collector.rollout.Rollout` over the
    same vector env and DQN policy (same num_envs, chunk_size, hidden sizes, epsilon) stepped
    here with `torch.set_num_threads(1)`, nothing else running.
(b) Learner: with the buffer filled by (a)'s collector and the collector stopped, one learner
    process trains freely on what the coordinator samples and reads chunks from storage; its
    train iterations/s come from the coordinator's counters. Ceiling: the single-process
    runner's update loop (`Replay.sample` -> `learner.batching.assemble` ->
    `DQNLearner.update`, policy refreshed every `publish_every` iterations) fed from memory,
    same batch size, network and buffer size.

Each ceiling is measured in two halves, one right before and one right after its cluster
window, with the cluster idle, so drift from other load on the machine hits both alike. The
CPU each process used during each window is shown, with what the rest of the machine used.

    python bench/throughput.py [--seconds 15] [--storage DIR_OR_REDIS_URL]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.common import (  # noqa: E402
    REPO_ROOT,
    CpuWindow,
    clear_storage,
    emit,
    fmt,
    free_running_data,
    is_redis,
    log,
    print_tables,
    progress,
    ratio,
    rounded,
)
from collector.rollout import Rollout  # noqa: E402
from coordinator.replay import Replay  # noqa: E402
from learner.arena import ChunkArena  # noqa: E402
from learner.batching import assemble_from  # noqa: E402
from services.launcher import Child, LocalCluster  # noqa: E402
from shared.algos.base import make_policy  # noqa: E402
from shared.config import DQNConfig, RunConfig, parse_config  # noqa: E402
from shared.envs import env_spec, make_vector_env  # noqa: E402
from shared.http import HttpClient, HttpError  # noqa: E402
from shared.schemas import API, ChunkMeta, SampleRequest  # noqa: E402

COLLECTOR_GOAL = 0.7   # collector_ratio the team aims for
LEARNER_GOAL = 0.9     # learner_utilisation the team aims for


# -- the config both sides use ------------------------------------------------------------

def bench_config(base: Path, name: str, storage: str, epsilon: float) -> RunConfig:
    """The base config made free-running: no replay-ratio throttling, no evaluations, no stop
    rule, and a constant epsilon (so in-process and cluster act alike from the first step)."""
    return parse_config(free_running_data(base, name, storage, epsilon), "bench config")


# -- in-process ceilings ------------------------------------------------------------------

@dataclass
class Rate:
    """A count over a window, per second of wall time and per CPU-second spent on it."""
    count: float
    seconds: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        return self.count / self.seconds

    @property
    def per_cpu_s(self) -> float | None:
        return self.count / self.cpu_s if self.cpu_s > 0 else None


def mean_rate(halves: list[Rate]) -> Rate:
    """Two half-windows as one: counts, seconds and CPU added up."""
    return Rate(sum(h.count for h in halves), sum(h.seconds for h in halves),
                sum(h.cpu_s for h in halves))


def fixed_epsilon(algo: DQNConfig, epsilon: float) -> DQNConfig:
    """The DQN settings with a constant epsilon, so both sides explore alike."""
    return algo.model_copy(update={"eps_start": epsilon, "eps_end": epsilon})


def rollout_steps_per_s(cfg: RunConfig, seconds: float, epsilon: float, seed: int) -> Rate:
    """Env steps/s of `Rollout.collect` on the collector's vector env and policy."""
    torch.set_num_threads(1)
    envs = make_vector_env(cfg.env, cfg.env.num_envs, seed)
    policy = make_policy(fixed_epsilon(cfg.algo, epsilon), env_spec(cfg.env), seed)
    rollout = Rollout(envs, policy, cfg.collector.chunk_size)
    rollout.collect()  # warm-up: first torch call, first chunk's allocations
    start_steps = rollout.env_steps
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        rollout.collect()
    rate = Rate(rollout.env_steps - start_steps, time.perf_counter() - t0,
                time.process_time() - c0)
    envs.close()
    return rate


@dataclass
class MemoryReplay:
    """What the single-process runner trains from: chunks in a dict, the coordinator's
    Replay (buffers and rate limiters) as the index."""
    replay: Replay
    chunks: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def fill_memory_replay(cfg: RunConfig, transitions: int, seed: int) -> MemoryReplay:
    torch.set_num_threads(1)
    envs = make_vector_env(cfg.env, cfg.env.num_envs, seed)
    policy = make_policy(fixed_epsilon(cfg.algo, 1.0), env_spec(cfg.env), seed)
    rollout = Rollout(envs, policy, cfg.collector.chunk_size)
    memory = MemoryReplay(Replay(cfg))
    full = False  # a full buffer may hold a little less than `transitions` (whole chunks)
    while memory.replay.size() < transitions and not full:
        chunk = rollout.collect()
        chunk_id = uuid.uuid4().hex
        memory.chunks[chunk_id] = chunk.arrays
        _, dead = memory.replay.insert([ChunkMeta(chunk_id=chunk_id, length=chunk.length,
                                                  policy_version=-1,
                                                  segments=chunk.segments)], 0)
        for gone in dead:
            memory.chunks.pop(gone, None)
            full = True
    envs.close()
    return memory


def update_loop_per_s(cfg: RunConfig, memory: MemoryReplay, seconds: float, seed: int) -> Rate:
    """Train iterations/s of the single-process runner's inner loop, fed from memory."""
    torch.set_num_threads(1)
    spec = env_spec(cfg.env)
    learner = make_policy(cfg.algo, spec, seed)
    policy = make_policy(cfg.algo, spec, seed)
    version = 0
    n = cfg.learner.batches_per_request
    plan = memory.replay.plan(SampleRequest(worker_id="bench", batch_size=cfg.algo.batch_size,
                                            num_batches=n))

    arena = ChunkArena(lambda ids: [memory.chunks[c] for c in ids], cfg.learner.chunk_cache)

    def one_request() -> None:
        nonlocal version
        chunk_ids, parts, _ = memory.replay.sample(plan, n, learner.train_iterations, version)
        offsets = arena.offsets(chunk_ids)  # may (re)allocate arena.columns: call first
        batches = assemble_from(arena.columns, offsets, parts, n)
        for batch in batches:
            learner.learn(batch.data, batch.weights)
            if learner.train_iterations % cfg.learner.publish_every == 0:
                version += 1
                policy.load_policy(version, learner.policy_state())

    one_request()  # warm-up
    start_iters = learner.train_iterations
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        one_request()
    return Rate(learner.train_iterations - start_iters, time.perf_counter() - t0,
                time.process_time() - c0)


# -- the cluster side ---------------------------------------------------------------------

class WorkerFailed(RuntimeError):
    """A worker process that exited, or whose loop reports an error in its /status."""


def worker_error(child: Child) -> str | None:
    if child.proc.poll() is not None:
        return f"exited with code {child.proc.returncode}"
    worker = HttpClient(child.url, timeout_s=2, retries=0)
    try:
        return worker.get("/status").get("error")
    except HttpError:
        return None  # not serving yet
    finally:
        worker.close()


def start_worker(cluster: LocalCluster, client: HttpClient, role: str, counter: str,
                 timeout_s: float = 120.0, attempts: int = 2) -> Child:
    """Start a collector or learner and wait until the coordinator's `counter` moves; a worker
    whose loop failed is replaced once (and the failure shown), so one bad start does not
    spoil the run."""
    for attempt in range(1, attempts + 1):
        child = cluster.add_collector() if role == "collector" else cluster.start_learner()
        start = client.get(f"{API}/status")["counters"][counter]
        deadline = time.monotonic() + timeout_s
        error = None
        while time.monotonic() < deadline and error is None:
            if client.get(f"{API}/status")["counters"][counter] > start:
                return child
            error = worker_error(child)
            time.sleep(0.2)
        error = error or f"no {counter} within {timeout_s:g} s"
        log(f"[yellow]{child.name} failed to start (attempt {attempt}/{attempts}): {error}; "
            f"last lines of {child.log_path}:[/]")
        progress.print(child.tail(8), markup=False, highlight=False)
        cluster.stop([child])
    raise WorkerFailed(f"{role} did not start after {attempts} attempts")


@dataclass
class Window:
    rate: Rate          # CPU: the worker's and the coordinator's, not this process's polling
    cpu: CpuWindow
    worker_status: dict


def measure_counter(client: HttpClient, counter: str, seconds: float, cpu: CpuWindow,
                    worker: Child) -> Window:
    """Rate of a coordinator counter over `seconds`, timed by this process's clock."""
    s0 = client.get(f"{API}/status")["counters"][counter]
    t0 = time.monotonic()
    cpu.start(t0)
    time.sleep(seconds)
    s1 = client.get(f"{API}/status")["counters"][counter]
    t1 = time.monotonic()
    cpu.stop(t1)
    worker_client = HttpClient(worker.url, timeout_s=5, retries=1)
    try:
        worker_status = worker_client.get("/status")
    except HttpError:
        worker_status = {}
    finally:
        worker_client.close()
    cluster_cpu = sum(v for k, v in cpu.used.items() if k != "bench")
    return Window(Rate(s1 - s0, t1 - t0, cluster_cpu), cpu, worker_status)


# -- output -------------------------------------------------------------------------------

def report_table(seconds: float, collect: Window, learn: Window, ceil_a: list[Rate],
                 ceil_b: list[Rate]) -> Table:
    t = Table(title=f"throughput over {seconds:g} s windows: cluster vs the same loop in one "
                    "process",
              caption="ceiling: two half-windows, right before and right after the cluster's "
                      "(each in brackets), cluster idle. Per CPU-second: the cluster's count "
                      "over the CPU its worker and the coordinator used, the ceiling's over "
                      "this process's CPU; it holds better than per second when other load "
                      "takes cores away.")
    for name, justify in (("figure", "left"), ("cluster", "right"), ("in-process ceiling",
                          "right"), ("ratio", "right"), ("goal", "right"),
                          ("CPU during the cluster window", "left")):
        t.add_column(name, justify=justify)

    def rows(label: str, cluster: Window, halves: list[Rate], goal: float) -> None:
        ceiling = mean_rate(halves)
        t.add_row(f"{label}/s", fmt(cluster.rate.per_s, ",.0f"),
                  f"{ceiling.per_s:,.0f} ({halves[0].per_s:,.0f} / {halves[1].per_s:,.0f})",
                  fmt(ratio(cluster.rate.per_s, ceiling.per_s), ".2f"), f">= {goal}",
                  cluster.cpu.describe())
        t.add_row(f"{label} per CPU-second", fmt(cluster.rate.per_cpu_s, ",.0f"),
                  f"{fmt(ceiling.per_cpu_s, ',.0f')} ({fmt(halves[0].per_cpu_s, ',.0f')} / "
                  f"{fmt(halves[1].per_cpu_s, ',.0f')})",
                  fmt(ratio(cluster.rate.per_cpu_s, ceiling.per_cpu_s), ".2f"), "", "")

    rows("collector env steps", collect, ceil_a, COLLECTOR_GOAL)
    t.add_section()
    rows("learner train iterations", learn, ceil_b, LEARNER_GOAL)
    return t


def worker_table(collect: Window, learn: Window) -> Table:
    t = Table(title="what the workers say about themselves (their /status at window end)")
    t.add_column("worker")
    t.add_column("figures")
    c = collect.worker_status
    t.add_row("collector", f"chunks written {c.get('chunks_written')}, reported "
                           f"{c.get('chunks_reported')}, policy version {c.get('policy_version')}")
    s = learn.worker_status
    timers = s.get("timers", {})
    t.add_row("learner", f"utilisation (update / (update + wait)) {s.get('utilisation')}, "
                         f"timers {timers}, dropped sample responses "
                         f"{s.get('dropped_sample_responses')}")
    return t


# -- main ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--storage", default=None,
                   help="directory or redis://host:port/db (default: a temporary directory)")
    p.add_argument("--seconds", type=float, default=15.0, help="length of each measured window")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds a worker runs before its window starts")
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "cartpole-dqn.yaml")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="rlfleet-throughput-"))
    name = f"bench-throughput-{os.getpid()}"
    storage = args.storage or str(work / "storage")
    if not is_redis(storage):
        storage = str(Path(storage).resolve() / name) if args.storage else storage
    cfg = bench_config(args.config, name, storage, args.epsilon)
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    half = args.seconds / 2
    log(f"storage {storage}, work dir {work}, {args.seconds:g} s windows, "
        f"{args.warmup:g} s warm-up")

    cluster = LocalCluster(config_path, work, storage)
    client: HttpClient | None = None
    try:
        coordinator = cluster.start_coordinator()
        client = HttpClient(coordinator.url, timeout_s=10, retries=2)

        def phase(tag: str, what: str, ceiling, role: str, counter: str
                  ) -> tuple[Window, list[Rate]]:
            """The in-process ceiling's first half, the worker's window, the second half."""
            log(f"({tag}) in-process {what}, first half...")
            halves = [ceiling()]
            log(f"({tag}) {role}: starting...")
            worker = start_worker(cluster, client, role, counter)
            time.sleep(args.warmup)
            log(f"({tag}) {role}: measuring for {args.seconds:g} s...")
            window = measure_counter(client, counter, args.seconds, CpuWindow(
                {role: worker.proc.pid, "coordinator": coordinator.proc.pid}), worker)
            cluster.stop([worker])
            log(f"({tag}) in-process {what}, second half...")
            halves.append(ceiling())
            return window, halves

        # (a) one collector beside Rollout in this process
        collect, ceil_a = phase(
            "a", "rollout", lambda: rollout_steps_per_s(cfg, half, args.epsilon, args.seed),
            "collector", "env_steps")
        # (b) one learner beside the update loop in this process, on a buffer of equal size
        buffered = client.get(f"{API}/status")["buffer"]["size"]
        log(f"(b) filling an in-memory buffer to the coordinator's {buffered:,} transitions...")
        replay = fill_memory_replay(cfg, buffered, args.seed)
        learn, ceil_b = phase(
            "b", "update loop", lambda: update_loop_per_s(cfg, replay, half, args.seed),
            "learner", "train_iterations")
    finally:
        if client is not None:
            client.close()
        cluster.shutdown()
        clear_storage(storage, name)
    shutil.rmtree(work, ignore_errors=True)  # kept, with the workers' logs, when a run fails

    in_a, in_b = mean_rate(ceil_a), mean_rate(ceil_b)

    def cores(w: Window) -> dict[str, float]:
        return {k: round(w.cpu.cores(k), 3) for k in w.cpu.used} | {
            "others": round(w.cpu.others_cores(), 3)}

    result = {
        "collector_steps_per_s": rounded(collect.rate.per_s, 1),
        "in_process_steps_per_s": rounded(in_a.per_s, 1),
        "collector_ratio": rounded(ratio(collect.rate.per_s, in_a.per_s)),
        "learner_updates_per_s": rounded(learn.rate.per_s, 1),
        "in_process_updates_per_s": rounded(in_b.per_s, 1),
        "learner_utilisation": rounded(ratio(learn.rate.per_s, in_b.per_s)),
        "collector_ratio_per_cpu": rounded(ratio(collect.rate.per_cpu_s, in_a.per_cpu_s)),
        "learner_utilisation_per_cpu": rounded(ratio(learn.rate.per_cpu_s, in_b.per_cpu_s)),
        "collector_steps_per_cpu_s": rounded(collect.rate.per_cpu_s, 1),
        "in_process_steps_per_cpu_s": rounded(in_a.per_cpu_s, 1),
        "learner_updates_per_cpu_s": rounded(learn.rate.per_cpu_s, 1),
        "in_process_updates_per_cpu_s": rounded(in_b.per_cpu_s, 1),
        "in_process_steps_per_s_halves": [round(h.per_s, 1) for h in ceil_a],
        "in_process_updates_per_s_halves": [round(h.per_s, 1) for h in ceil_b],
        "cpu_cores_collect_window": cores(collect),
        "cpu_cores_learn_window": cores(learn),
        "seconds": args.seconds,
        "storage": "redis" if is_redis(storage) else "directory",
        "num_envs": cfg.env.num_envs,
        "chunk_size": cfg.collector.chunk_size,
        "epsilon": args.epsilon,
        "batch_size": cfg.algo.batch_size,
        "batches_per_request": cfg.learner.batches_per_request,
        "buffer_transitions": buffered,
    }
    print_tables(report_table(args.seconds, collect, learn, ceil_a, ceil_b),
                 worker_table(collect, learn))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
