"""Throughput of the two hot loops, each beside the same loop run in this process.

(a) Collector: one collector process (coordinator up, no learner, no replay-ratio throttling,
    no evaluations) writes chunks to storage and reports them; its env steps/s come from the
    coordinator's counters over a fixed window. Ceiling: the collector's `Rollout` over the
    same vector env and DQN policy (same num_envs, chunk_size, hidden sizes, epsilon) stepped
    here with `torch.set_num_threads(1)`, nothing else running.
(b) Learner: with the buffer filled by a collector and the collector stopped, one learner
    process trains freely on what the coordinator samples and reads chunks from storage; its
    train iterations/s come from the coordinator's counters. Ceiling: the single-process
    runner's update loop (`Replay.sample` -> `rlfleet.shared.batching.batching.assemble` ->
    `DQNLearner.update`, policy refreshed every `publish_every` iterations, new priorities
    written back after every sample) fed from memory, same batch size, network and buffer.
    Three learners, each on a coordinator of its own: batch 64 on the uniform buffer (on
    (a)'s coordinator), batch 256, and batch 64 on the prioritized buffer
    (`configs/cartpole-dqn-per.yaml`).

Each ceiling is measured in two halves, one right before and one right after its cluster
window, with the cluster idle, so drift from other load on the machine hits both alike. The
CPU each process used during each window is shown, with what the rest of the machine used.

    python -m bench.throughput [--seconds 15] [--storage DIR_OR_REDIS_URL]
                               [--learners 64 256 per] [--fill-to N] [--short]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from rich.table import Table

from bench.common import (
    REPO_ROOT,
    CpuWindow,
    LocalRun,
    Rate,
    WaitTimeout,
    WorkerFailed,
    clear_storage,
    coordinator_up,
    counter_rate,
    fmt,
    free_running_data,
    is_redis,
    log,
    mean_rate,
    parse_args,
    progress,
    ratio,
    report,
    rounded,
    run_main,
    wait_for,
    worker_status,
    write_yaml,
)
from rlfleet.learner.output.feedback import PriorityFeedback
from rlfleet.local.launcher import Child, LocalCluster
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.batching.arena import ChunkArena
from rlfleet.shared.batching.batching import assemble_from
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.sampling import SampleRequest
from rlfleet.shared.envs.make import env_spec, make_vector_env
from rlfleet.shared.replay.replay import Replay
from rlfleet.shared.rollout.rollout import Rollout
from rlfleet.shared.run.config import RunConfig, parse_config

COLLECTOR_GOAL = 0.7   # collector_ratio the team aims for
LEARNER_GOAL = 0.9     # learner_utilisation the team aims for
FIGURES = ("collector_steps_per_s", "in_process_steps_per_s", "collector_ratio",
           "collector_ratio_per_cpu", "learner_utilisation", "learner_updates_per_s",
           "in_process_updates_per_s", "learner_utilisation_256", "learner_updates_per_s_256",
           "in_process_updates_per_s_256", "learner_utilisation_per",
           "learner_updates_per_s_per", "in_process_updates_per_s_per")
# All three learners still, each over a half-second window after a quarter second of
# warm-up; the later learners' coordinators filled to 5,000 transitions (past min_size), not
# to the tens of thousands (a) leaves: the fill is set-up, not what is measured, and a
# smaller buffer is also quicker to fill in memory for the ceiling.
SHORT = {"seconds": 0.5, "warmup": 0.25, "fill_to": 5_000}


# -- the config both sides use ------------------------------------------------------------

def bench_config(base: Path, name: str, storage: str, epsilon: float) -> RunConfig:
    """The base config made free-running: no replay-ratio throttling, no evaluations, no stop
    rule, and a constant epsilon (so in-process and cluster act alike from the first step)."""
    return parse_config(free_running_data(base, name, storage, epsilon), "bench config")


# -- in-process ceilings ------------------------------------------------------------------

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
        feedback = PriorityFeedback()
        for batch in batches:
            out = learner.learn(batch.data, batch.weights)
            if batch.item_refs and out.priorities is not None:
                feedback.add(batch, out.priorities)
            if learner.train_iterations % cfg.learner.publish_every == 0:
                version += 1
                policy.load_policy(version, learner.policy_state())
        memory.replay.update_priorities(feedback.take())

    one_request()  # warm-up
    start_iters = learner.train_iterations
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        one_request()
    return Rate(learner.train_iterations - start_iters, time.perf_counter() - t0,
                time.process_time() - c0)


# -- the cluster side ---------------------------------------------------------------------

def start_worker(run: LocalRun, role: str, counter: str, timeout_s: float = 120.0,
                 attempts: int = 2) -> Child:
    """Start a collector or learner and wait until the coordinator's `counter` moves; a worker
    whose loop failed is replaced once (and the failure shown), so one bad start does not
    spoil the run."""
    for attempt in range(1, attempts + 1):
        child = run.cluster.add_collector() if role == "collector" \
            else run.cluster.start_learner()
        start = run.counter(counter)

        def moved(child: Child = child, start: int = start) -> bool:
            if run.counter(counter) > start:
                return True
            if child.proc.poll() is not None:
                raise WorkerFailed(f"exited with code {child.proc.returncode}")
            error = worker_status(child, timeout_s=2, retries=0).get("error")
            if error:
                raise WorkerFailed(error)
            return False

        try:
            wait_for(moved, timeout_s, counter)
            return child
        except (WorkerFailed, WaitTimeout) as err:
            log(f"[yellow]{child.name} failed to start (attempt {attempt}/{attempts}): {err}; "
                f"last lines of {child.log_path}:[/]")
        progress.print(child.tail(8), markup=False, highlight=False)
        run.cluster.stop([child])
    raise WorkerFailed(f"{role} did not start after {attempts} attempts")


@dataclass
class Window:
    rate: Rate          # CPU: the worker's and the coordinator's, not this process's polling
    cpu: CpuWindow
    worker_status: dict


def measure_counter(run: LocalRun, counter: str, seconds: float, cpu: CpuWindow,
                    worker: Child) -> Window:
    """Rate of a coordinator counter over `seconds`, and what the worker says at its end."""
    rate = counter_rate(run, counter, seconds, cpu)
    return Window(rate, cpu, worker_status(worker))


def beside_ceiling(run: LocalRun, label: str, what: str, ceiling: Callable[[], Rate], role: str,
                   counter: str, seconds: float, warmup: float, start_timeout_s: float = 120.0
                   ) -> tuple[Window, list[Rate]]:
    """A worker's window between the two halves of its in-process ceiling: the first half,
    then a `role` worker started, run for `warmup` s and measured by the coordinator's
    `counter` over `seconds`, then stopped, then the second half (the cluster idle during
    both), so that drift in the machine's load hits both alike."""
    log(f"{label} in-process {what}, first half...")
    halves = [ceiling()]
    log(f"{label} {role}: starting...")
    worker = start_worker(run, role, counter, timeout_s=start_timeout_s)
    time.sleep(warmup)
    log(f"{label} {role}: measuring for {seconds:g} s...")
    window = measure_counter(run, counter, seconds, CpuWindow(
        {role: worker.proc.pid, "coordinator": run.coordinator.proc.pid}), worker)
    run.cluster.stop([worker])
    log(f"{label} in-process {what}, second half...")
    halves.append(ceiling())
    return window, halves


# -- output -------------------------------------------------------------------------------

LEARNERS = {  # variant: (label, config, batch size)
    "64": ("batch 64, uniform", REPO_ROOT / "configs" / "cartpole-dqn.yaml", 64),
    "256": ("batch 256, uniform", REPO_ROOT / "configs" / "cartpole-dqn.yaml", 256),
    "per": ("batch 64, prioritized", REPO_ROOT / "configs" / "cartpole-dqn-per.yaml", 64),
}
UTILISATION_KEYS = {"64": "learner_utilisation", "256": "learner_utilisation_256",
                    "per": "learner_utilisation_per"}


@dataclass
class Measured:
    window: Window
    halves: list[Rate]
    cfg: RunConfig


def report_table(seconds: float, collect: Window, ceil_a: list[Rate],
                 learns: dict[str, Measured]) -> Table:
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
    for variant, m in learns.items():
        t.add_section()
        rows(f"learner train iterations ({LEARNERS[variant][0]})", m.window, m.halves,
             LEARNER_GOAL)
    return t


def worker_table(collect: Window, learns: dict[str, Measured]) -> Table:
    t = Table(title="what the workers say about themselves (their /status at window end)")
    t.add_column("worker")
    t.add_column("figures")
    c = collect.worker_status
    t.add_row("collector", f"chunks written {c.get('chunks_written')}, reported "
                           f"{c.get('chunks_reported')}, policy version {c.get('policy_version')}")
    for variant, m in learns.items():
        s = m.window.worker_status
        t.add_row(f"learner ({LEARNERS[variant][0]})",
                  f"utilisation (update / (update + wait)) {s.get('utilisation')}, timers "
                  f"{s.get('timers', {})}, versions superseded {s.get('versions_superseded')}"
                  f", dropped sample responses {s.get('dropped_sample_responses')}")
    return t


# -- main ---------------------------------------------------------------------------------

def variant_config(variant: str, name: str, storage: str, epsilon: float) -> RunConfig:
    _, base, batch = LEARNERS[variant]
    data = free_running_data(base, name, storage, epsilon)
    data["algo"]["batch_size"] = batch
    return parse_config(data, f"bench config ({variant})")


def fill(run: LocalRun, target: int, timeout_s: float) -> int:
    """Run one collector until the coordinator's buffer holds `target` transitions (or
    `timeout_s` has passed); what it holds then."""
    collector = start_worker(run, "collector", "env_steps")
    try:
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda: run.buffer_size() >= target, timeout_s, "full buffer", 0.5)
        return run.buffer_size()
    finally:
        run.cluster.stop([collector])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--storage", default=None,
                   help="directory or redis://host:port/db (default: a temporary directory)")
    p.add_argument("--seconds", type=float, default=15.0, help="length of each measured window")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds a worker runs before its window starts")
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--learners", nargs="+", choices=sorted(LEARNERS), default=list(LEARNERS),
                   help="which learners to measure (default: all three)")
    p.add_argument("--fill-to", type=int, default=None,
                   help="transitions the learners after the first are given (default: what "
                   "(a)'s collector left in the first's buffer)")
    p.add_argument("--seed", type=int, default=0)
    args = parse_args(p, argv, SHORT)

    work = Path(tempfile.mkdtemp(prefix="rlfleet-throughput-"))
    half = args.seconds / 2
    log(f"work dir {work}, {args.seconds:g} s windows, {args.warmup:g} s warm-up")

    def storage_for(name: str) -> str:
        storage = args.storage or str(work / "storage" / name)
        if not is_redis(storage) and args.storage:
            storage = str(Path(storage).resolve() / name)
        return storage

    learns: dict[str, Measured] = {}
    collect: Window | None = None
    base_cfg: RunConfig | None = None
    ceil_a: list[Rate] = []
    buffered = 0
    order = ["64"] + [v for v in LEARNERS if v != "64"]  # (a) fills the batch-64 buffer
    for variant in order:
        if variant not in args.learners and (variant != "64" or collect is not None):
            continue
        name = f"bench-throughput-{os.getpid()}-{variant}"
        storage = storage_for(name)
        cfg = variant_config(variant, name, storage, args.epsilon)
        run_dir = work / variant
        cluster = LocalCluster(write_yaml(run_dir / "config.yaml", cfg), run_dir, storage)
        try:
            with coordinator_up(cluster) as run:
                if collect is None:
                    # (a) one collector beside Rollout in this process
                    collect, ceil_a = beside_ceiling(
                        run, "(a)", "rollout",
                        lambda cfg=cfg: rollout_steps_per_s(cfg, half, args.epsilon, args.seed),
                        "collector", "env_steps", args.seconds, args.warmup)
                    buffered = run.buffer_size()
                    base_cfg = cfg
                else:
                    target = buffered if args.fill_to is None else args.fill_to
                    log(f"(b {variant}) filling the coordinator's buffer to {target:,}...")
                    fill(run, target, timeout_s=120)
                if variant in args.learners:
                    size = run.buffer_size()
                    log(f"(b {variant}) filling an in-memory buffer to the coordinator's "
                        f"{size:,} transitions...")
                    replay = fill_memory_replay(cfg, size, args.seed)
                    window, halves = beside_ceiling(
                        run, f"(b {variant})", "update loop",
                        lambda cfg=cfg, replay=replay: update_loop_per_s(cfg, replay, half,
                                                                         args.seed),
                        "learner", "train_iterations", args.seconds, args.warmup)
                    learns[variant] = Measured(window, halves, cfg)
        finally:
            clear_storage(storage, name)
    shutil.rmtree(work, ignore_errors=True)  # kept, with the workers' logs, when a run fails
    assert collect is not None and base_cfg is not None

    in_a = mean_rate(ceil_a)

    def cores(w: Window) -> dict[str, float]:
        return {k: round(w.cpu.cores(k), 3) for k in w.cpu.used} | {
            "others": round(w.cpu.others_cores(), 3)}

    result = {
        "collector_steps_per_s": rounded(collect.rate.per_s, 1),
        "in_process_steps_per_s": rounded(in_a.per_s, 1),
        "collector_ratio": rounded(ratio(collect.rate.per_s, in_a.per_s)),
        "collector_ratio_per_cpu": rounded(ratio(collect.rate.per_cpu_s, in_a.per_cpu_s)),
        "collector_steps_per_cpu_s": rounded(collect.rate.per_cpu_s, 1),
        "in_process_steps_per_cpu_s": rounded(in_a.per_cpu_s, 1),
        "in_process_steps_per_s_halves": [round(h.per_s, 1) for h in ceil_a],
        "cpu_cores_collect_window": cores(collect),
    }
    for variant, m in learns.items():
        key = UTILISATION_KEYS[variant]
        suffix = key.removeprefix("learner_utilisation")
        ceiling = mean_rate(m.halves)
        result |= {
            key: rounded(ratio(m.window.rate.per_s, ceiling.per_s)),
            f"learner_utilisation_per_cpu{suffix}": rounded(ratio(m.window.rate.per_cpu_s,
                                                                  ceiling.per_cpu_s)),
            f"learner_updates_per_s{suffix}": rounded(m.window.rate.per_s, 1),
            f"in_process_updates_per_s{suffix}": rounded(ceiling.per_s, 1),
            f"learner_updates_per_cpu_s{suffix}": rounded(m.window.rate.per_cpu_s, 1),
            f"in_process_updates_per_cpu_s{suffix}": rounded(ceiling.per_cpu_s, 1),
            f"in_process_updates_per_s_halves{suffix}": [round(h.per_s, 1) for h in m.halves],
            f"cpu_cores_learn_window{suffix}": cores(m.window),
        }
    result |= {
        "seconds": args.seconds,
        "storage": "redis" if args.storage and is_redis(args.storage) else "directory",
        "num_envs": base_cfg.env.num_envs,
        "chunk_size": base_cfg.collector.chunk_size,
        "epsilon": args.epsilon,
        "batches_per_request": base_cfg.learner.batches_per_request,
        "buffer_transitions": buffered,
    }
    report(result, report_table(args.seconds, collect, ceil_a, learns),
           worker_table(collect, learns))
    return 0


if __name__ == "__main__":
    run_main(main)
