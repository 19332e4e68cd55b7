"""Samples learned per second by a data-parallel learner group of 1 and of 2 learners, beside
one process training the same network from memory; and the seconds the group takes to train
again after one of its 2 learners is killed.

Why: a learner group pays only if 2 learners learn nearly twice as fast as one (the goal:
scaling efficiency >= 0.8 at 2 learners, one torch thread each, on a 2-core machine), and it
holds up only if losing a learner costs seconds of training, not the run.

Setup. One coordinator (`python -m rlfleet coordinator`, through `LocalCluster`) on a
temporary directory as storage. Its replay buffer is prefilled with `--transitions` random
CartPole-shaped transitions that this process writes to storage and reports over HTTP as a
registered collector would (`bench.common.prefill`); no collector runs, so the buffer does
not change and nothing else of the run competes for the cores. The config is
configs/cartpole-dqn.yaml made free-running (no replay-ratio limit, no evaluations, no stop
rule) with min_size 1,000 and a network where compute dominates: DQN with an MLP of hidden
sizes (1024, 1024) and a global batch of `--batch-size` (256: each of 2 ranks learns on a
shard of 128); checkpoints only when a learner stops. Learners are `python -m rlfleet
learner` processes (`LocalCluster.add_learner`), each in a session of its own, so its whole
process group (the learner and its data process) can be killed at once.

(a) Throughput. For each learner count n (1 and 2; their order alternates over `--repeats`
    rounds), start n learners, wait until the coordinator's learner group has world size n
    and trains, let it run `--warmup` s, then measure over `--seconds`. Samples/s are train
    iterations/s x the global batch size. Train iterations are the coordinator's
    `counters.train_iterations`, polled every 0.1 s; a learner reports them once per sample
    response (32 train iterations, 1-2 s here), so the rate is taken between the first and
    the last time the counter moved within the window, not between the window's ends (a
    window runs on, up to 3 x `--seconds`, until the counter has moved 3 times).
    Efficiency at n: samples/s at n / (n x samples/s at 1).
    All-reduce ms per train iteration: from each rank's own `GET /status` (`group.allreduce_s`)
    over the window, averaged over the ranks; it counts waiting for the slower rank too. The
    coordinator's `learner_group.ranks[].allreduce_ms` (its latest learn-info report) is
    shown beside it.
    Ceiling: the same `shared.algos.dqn.DQN` learning in this process (`torch.set_num_threads
    (1)`) from batches held in memory, measured in two halves, right before the first
    cluster window and right after the last, with no learner running; each learner count is
    shown as a ratio to n x that ceiling. Two more in-process figures locate the losses: the
    same loop at a rank's shard (batch 128), what a rank could do with no collective; and a
    bare pair, two processes (this script with `--probe-rank`) each learning on its shard
    from memory with the learner's own `DistReducer` over gloo, the group with no
    coordinator, no HTTP and no storage: what torch.distributed itself costs on this machine.
(b) Re-formation. Start 2 learners; once they have trained in a generation of world size 2
    for `--warmup` s, SIGKILL one rank's process group (`--kill-rank`) and poll the
    coordinator's status every 0.05 s: reform_s is the time from the kill until the group is
    at a newer generation of world size 1 and `counters.train_iterations` has moved since.
    Shown with its parts: kill -> newer generation; -> the survivor's first sample granted
    (`counters.granted_batches`); -> train iterations moving, which also waits for the
    survivor to learn on its first sample response and report it.

Each window shows the CPU its learners and the coordinator used, and what everything else on
the machine used; a window in which the rest used more than 0.25 cores is marked busy. A group
of 2 on 2 cores suffers most from such a neighbour: its ranks step in lockstep, so either one
losing its core stalls both. The JSON figures are medians over the rounds; the tables show
the spread.

    python -m bench.learners [--repeats 2] [--seconds 12] [--warmup 6] [--batch-size 256]
                             [--kill-rank 1] [--quick] [--short]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from rich.table import Table

from bench import common
from bench.common import (
    REPO_ROOT,
    CpuWindow,
    LocalRun,
    Rate,
    WorkerFailed,
    clear_storage,
    coordinator_up,
    fmt,
    free_running_data,
    log,
    mean_rate,
    median,
    prefill,
    progress,
    ratio,
    report,
    rounded,
    run_main,
    worker_status,
    write_yaml,
)
from rlfleet.cli import free_port
from rlfleet.learner.group.member import DistReducer
from rlfleet.local.launcher import Child, LocalCluster
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.envs.make import env_spec
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.run.config import RunConfig, load_config, parse_config

HIDDEN_SIZES = (1024, 1024)
CHUNK_ROWS = 1_000          # transitions per prefilled chunk
MIN_SIZE = 1_000            # transitions before the first sample
EFFICIENCY_GOAL = 0.8
COUNTS = (1, 2)             # learner counts measured
POLL_S = 0.1                # counter polling during a window
REFORM_POLL_S = 0.05        # status polling after the kill
BUSY_OTHERS = 0.25          # cores used by the rest of the machine that make a window suspect
FIGURES = ("samples_per_s", "efficiency", "allreduce_ms", "reform_s", "ratio_to_in_process",
           "in_process_samples_per_s", "in_process_shard_samples_per_s",
           "bare_pair_samples_per_s", "bare_pair_efficiency", "bare_pair_allreduce_ms",
           "reform_generation_s", "reform_sampling_s", "compute_ms", "sample_wait_ms")
# One round of 1 s windows after half a second of warm-up, half-second ceilings, a smaller
# buffer, a quarter of the batch and a quarter of the batches a request carries (a rank's
# sample response then takes a fraction of a second, so a short window still sees the
# counter move 3 times, and a group trains soon after it forms).
SHORT = {"repeats": 1, "seconds": 1.0, "warmup": 0.5, "ceiling_s": 0.5, "transitions": 5_000,
         "batch_size": 256, "batches_per_request": 16}


# -- config and data ----------------------------------------------------------------------

def bench_config(base: Path, name: str, storage: str, transitions: int,
                 batch_size: int, batches_per_request: int | None = None) -> RunConfig:
    """The base config made free-running, with a network where compute dominates, a buffer
    that holds the prefill and samples early, and checkpoints only when a learner stops;
    `batches_per_request` replaces the config's where given (a short run's smaller sample
    responses)."""
    data = free_running_data(base, name, storage, epsilon=0.1)
    data["algo"].update(hidden_sizes=list(HIDDEN_SIZES), batch_size=batch_size)
    if batches_per_request is not None:
        data["learner"]["batches_per_request"] = batches_per_request
    for buffer in data["buffers"].values():
        buffer["capacity"] = max(int(buffer["capacity"]), transitions)
        buffer["rate_limit"]["min_size"] = MIN_SIZE
    data["checkpoint"]["every_train_iterations"] = 10**12
    return parse_config(data, "bench config")


def random_columns(spec: EnvSpec, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Transitions shaped like the env's (random values: learning speed does not depend on
    them), with the fields and dtypes a collector writes (`BASE_FIELDS`)."""
    terminated = rng.random(rows) < 0.02
    cut = terminated.copy()
    cut[-1] = True
    return {"obs": rng.standard_normal((rows, *spec.obs_shape), dtype=np.float32),
            "action": rng.integers(0, spec.n_actions, rows, dtype=np.int64),
            "reward": np.ones(rows, dtype=np.float32),
            "next_obs": rng.standard_normal((rows, *spec.obs_shape), dtype=np.float32),
            "terminated": terminated, "truncated": np.zeros(rows, dtype=bool), "cut": cut}


def chunks(spec: EnvSpec, transitions: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    for start in range(0, transitions, CHUNK_ROWS):
        yield random_columns(spec, min(CHUNK_ROWS, transitions - start), rng)


def memory_batches(spec: EnvSpec, batch_size: int, seed: int, count: int = 8
                   ) -> list[dict[str, torch.Tensor]]:
    """What `DQN.learn` is given, held in memory (the ceilings cycle through them)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        cols = random_columns(spec, batch_size, rng)
        out.append({k: torch.from_numpy(cols[k])
                    for k in ("obs", "action", "reward", "next_obs", "terminated")})
    return out


# -- in-process ceilings ------------------------------------------------------------------

def ceiling(cfg: RunConfig, spec: EnvSpec, batch_size: int, seconds: float, seed: int) -> Rate:
    """Samples/s of `DQN.learn` in this process, one torch thread, batches from memory (the
    rate's count is samples)."""
    torch.set_num_threads(1)
    policy = DQN(cfg.algo, spec, seed)
    batches = memory_batches(spec, batch_size, seed)
    for batch in batches[:3]:  # warm-up: first calls allocate
        policy.learn(batch)
    done = 0
    t0 = time.perf_counter()
    for batch in itertools.cycle(batches):
        policy.learn(batch)
        done += 1
        if time.perf_counter() - t0 >= seconds:
            break
    return Rate(done * batch_size, time.perf_counter() - t0)


def probe_rank(config: Path, rank: int, port: int, iterations: int, seed: int) -> None:
    """One rank of the bare pair (run as `--probe-rank`): the learner's `DistReducer` over a
    gloo group of 2, `DQN.learn` on this rank's shard of each batch, from memory; prints one
    JSON line."""
    torch.set_num_threads(1)
    cfg = load_config(config)
    spec = env_spec(cfg.env)
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=rank == 0,
                          timeout=timeout)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("pair/", store), rank, 2, timeout)
    policy = DQN(cfg.algo, spec, seed)  # same seed: identical weights on both ranks
    reducer = DistReducer(pg, rank, 2)
    policy.set_reducer(reducer)
    batches = memory_batches(spec, cfg.algo.batch_size // 2, seed + rank)
    for batch in batches[:3]:
        policy.learn(batch)
    reducer.sum_([torch.zeros(1)])  # a barrier: both ranks start the clock together
    reducer.seconds, reducer.calls = 0.0, 0
    t0 = time.perf_counter()
    for _, batch in zip(range(iterations), itertools.cycle(batches), strict=False):
        policy.learn(batch)
    seconds = time.perf_counter() - t0
    print(json.dumps({"rank": rank, "iterations": iterations, "seconds": seconds,
                      "allreduce_s": reducer.seconds}), flush=True)


@dataclass
class PairCeiling:
    iterations: int
    seconds: float            # the slower rank's
    allreduce_ms: float       # per train iteration, mean over the ranks

    def samples_per_s(self, batch_size: int) -> float:
        return self.iterations * batch_size / self.seconds


def pair_ceiling(config: Path, iterations: int, seed: int, timeout_s: float = 180.0
                 ) -> PairCeiling:
    """Two `--probe-rank` processes, each in its own session, side by side."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "bench.learners", "--config",
                               str(config), "--probe-rank", str(rank), "--probe-port",
                               str(port), "--probe-iterations", str(iterations), "--seed",
                               str(seed)], stdout=subprocess.PIPE, cwd=REPO_ROOT,
                              start_new_session=True, text=True) for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if any(p.returncode for p in procs):
        raise WorkerFailed(f"the bare pair failed: exit codes {[p.returncode for p in procs]}")
    ranks = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    return PairCeiling(iterations, max(r["seconds"] for r in ranks),
                       1000.0 * sum(r["allreduce_s"] for r in ranks) / (2 * iterations))


# -- learners -----------------------------------------------------------------------------

def kill_group(child: Child) -> None:
    """SIGKILL a learner's whole process group (it leads its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        child.proc.wait(timeout=10)


def stop_learners(cluster: LocalCluster, children: list[Child]) -> None:
    """SIGTERM (a learner leaves the group and checkpoints), then whatever is left of each
    process group is killed."""
    cluster.stop(children)
    for child in children:
        kill_group(child)


def group_of(status: dict) -> dict:
    return status.get("learner_group") or {}


def rank_ids(status: dict) -> list[str]:
    return [r["worker_id"] for r in group_of(status).get("ranks", [])]


def start_learners(run: LocalRun, n: int, timeout_s: float = 120.0
                   ) -> tuple[list[Child], dict]:
    """Start n learners; return once the group's ranks are exactly them, the coordinator's
    train iterations have moved in that generation, and every rank has trained in it by its
    own account (`trains_in`): the coordinator's counter alone also moves with a late report
    from the generation before, and a rank killed while the group still forms measures a
    rendezvous, not a re-formation. Returns the coordinator's status then."""
    children = [run.cluster.add_learner() for _ in range(n)]
    names = sorted(c.name for c in children)
    deadline = time.monotonic() + timeout_s
    generation, base = None, 0
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        for child in children:
            if child.proc.poll() is not None:
                progress.print(child.tail(12), markup=False, highlight=False)
                stop_learners(run.cluster, children)
                raise WorkerFailed(f"{child.exit_text()} while the group formed")
        status = run.status()
        iterations = status["counters"]["train_iterations"]
        if sorted(rank_ids(status)) == names:
            if group_of(status)["generation"] != generation:
                generation, base, seen = group_of(status)["generation"], iterations, {}
            elif iterations > base and all([trains_in(c, generation, n, seen)
                                            for c in children]):
                return children, status
        time.sleep(0.2)
    stop_learners(run.cluster, children)
    raise WorkerFailed(f"{n} learner(s) did not train as one group within {timeout_s:g} s")


def trains_in(child: Child, generation: int, n: int, seen: dict[str, int]) -> bool:
    """Whether `child` has formed `generation` as one of `n` ranks and trains in it, by its
    own /status: its train iterations moved since it first named that generation (a learner
    names its new generation before its rendezvous completes). `seen` keeps each learner's
    count at that first sight."""
    status = worker_status(child)
    group = status.get("group") or {}
    if group.get("generation") != generation or group.get("world_size") != n:
        return False
    iterations = status["train_iterations"]
    return iterations > seen.setdefault(child.name, iterations)


@dataclass
class RankFigures:
    """One rank over a window, from its own /status: ms per train iteration by phase."""
    worker_id: str
    iterations: int
    compute_ms: float | None     # in `learn`, outside collectives
    allreduce_ms: float | None   # in collectives, waiting for the other rank included
    wait_ms: float | None        # waiting for a ready sample response
    publish_ms: float | None     # publishing policy versions (rank 0 only)

    @staticmethod
    def between(worker_id: str, a: dict, b: dict) -> RankFigures:
        its = b.get("train_iterations", 0) - a.get("train_iterations", 0)

        def per_it(seconds: float) -> float | None:
            return 1000.0 * seconds / its if its > 0 else None

        def timer(s: dict, key: str) -> float:
            return float(s.get("timers", {}).get(key, 0.0))

        def allreduce(s: dict) -> float:
            return float((s.get("group") or {}).get("allreduce_s", 0.0))

        update = timer(b, "update_s") - timer(a, "update_s")
        coll = allreduce(b) - allreduce(a)
        publish = timer(b, "publish_s") - timer(a, "publish_s")
        return RankFigures(worker_id, its, per_it(update - coll - publish), per_it(coll),
                           per_it(timer(b, "wait_s") - timer(a, "wait_s")), per_it(publish))


@dataclass
class GroupWindow:
    learners: int
    round: int
    batch_size: int
    iterations: int                  # between the first and the last counter step
    seconds: float
    generation: int
    stable: bool                     # same generation and world size all window long
    ranks: list[RankFigures]
    coordinator_allreduce_ms: list[float]
    cpu: CpuWindow

    @property
    def samples_per_s(self) -> float | None:
        return self.iterations * self.batch_size / self.seconds if self.seconds > 0 else None

    @property
    def iterations_per_s(self) -> float | None:
        return self.iterations / self.seconds if self.seconds > 0 else None

    def rank_mean(self, name: str) -> float | None:
        values = [getattr(r, name) for r in self.ranks if getattr(r, name) is not None]
        return sum(values) / len(values) if values else None

    @property
    def busy(self) -> bool:
        return self.cpu.others_cores() > BUSY_OTHERS


def counter_steps(samples: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The polls at which a stepwise counter had moved: (time, value)."""
    return [(t, v) for (_, u), (t, v) in itertools.pairwise(samples) if v != u]


def steps(samples: list[tuple[float, int]]) -> int:
    return len(counter_steps(samples))


def step_rate(samples: list[tuple[float, int]]) -> tuple[int, float]:
    """(iterations, seconds) between the first and the last time a stepwise counter moved,
    each step timed by the first poll that saw it."""
    moved = counter_steps(samples)
    if len(moved) < 2:
        return 0, 0.0
    (ta, va), (tb, vb) = moved[0], moved[-1]
    return vb - va, tb - ta


def measure_group(run: LocalRun, n: int, round_: int, batch_size: int, warmup: float,
                  seconds: float) -> GroupWindow:
    children, status = start_learners(run, n)
    try:
        log(f"round {round_}: {n} learner(s) training in generation "
            f"{group_of(status)['generation']}; {warmup:g} s warm-up, {seconds:g} s window")
        time.sleep(warmup)
        pids = {c.name: c.proc.pid for c in children}
        cpu = CpuWindow({**pids, "coordinator": run.coordinator.proc.pid})
        before = {c.name: worker_status(c) for c in children}
        first = run.status()
        t0 = time.monotonic()
        cpu.start(t0)
        samples = [(t0, first["counters"]["train_iterations"])]
        last = first
        # A window needs 3 counter steps at least (2 whole sample responses between them):
        # on a slow machine it goes on for up to 3 x `seconds` to see them.
        while (elapsed := time.monotonic() - t0) < seconds or (
                steps(samples) < 3 and elapsed < 3 * seconds):
            time.sleep(POLL_S)
            last = run.status()
            samples.append((time.monotonic(), last["counters"]["train_iterations"]))
        cpu.stop(time.monotonic())
        after = {c.name: worker_status(c) for c in children}
        iterations, span = step_rate(samples)
        g0, g1 = group_of(first), group_of(last)
        stable = g0["generation"] == g1["generation"] and g1["world_size"] == n
        ranks = [RankFigures.between(w, before[w], after[w]) for w in rank_ids(last)
                 if w in pids]
        coord_ms = [float(r.get("allreduce_ms", 0.0)) for r in g1.get("ranks", [])]
        return GroupWindow(n, round_, batch_size, iterations, span, g1["generation"], stable,
                           ranks, coord_ms, cpu)
    finally:
        stop_learners(run.cluster, children)


@dataclass
class Reform:
    killed_rank: int
    killed: str
    survivor: str
    generation_before: int
    generation_after: int | None = None
    to_generation_s: float | None = None
    to_sampling_s: float | None = None
    to_training_s: float | None = None
    reasons: list[str] = field(default_factory=list)


def measure_reform(run: LocalRun, kill_rank: int, warmup: float, timeout_s: float) -> Reform:
    """Kill one of 2 training ranks; time the survivor's return to training in a group of 1."""
    children, status = start_learners(run, 2)
    try:
        log(f"re-formation: 2 learners in generation {group_of(status)['generation']}; "
            f"{warmup:g} s, then SIGKILL of rank {kill_rank}")
        time.sleep(warmup)
        status = run.status()
        group = group_of(status)
        ids = rank_ids(status)
        if group["world_size"] != 2:
            raise WorkerFailed(f"the group left world size 2 before the kill: {group}")
        victim = next(c for c in children if c.name == ids[kill_rank])
        result = Reform(kill_rank, victim.name, ids[1 - kill_rank], group["generation"])
        poller = HttpClient(run.coordinator.url, timeout_s=2, retries=0)
        iterations0 = granted0 = 0
        t_kill = time.monotonic()
        os.killpg(victim.proc.pid, signal.SIGKILL)
        try:
            while time.monotonic() - t_kill < timeout_s:
                time.sleep(REFORM_POLL_S)
                try:
                    status = poller.get(f"{API}/status")
                except HttpError:
                    continue
                now, group, counters = time.monotonic(), group_of(status), status["counters"]
                if result.to_generation_s is None:
                    if (group["generation"] > result.generation_before
                            and rank_ids(status) == [result.survivor]):
                        result.to_generation_s = now - t_kill
                        result.generation_after = group["generation"]
                        iterations0 = counters["train_iterations"]
                        granted0 = counters["granted_batches"]
                    continue
                if result.to_sampling_s is None and counters["granted_batches"] > granted0:
                    result.to_sampling_s = now - t_kill
                if counters["train_iterations"] > iterations0:
                    result.to_training_s = now - t_kill
                    break
        finally:
            poller.close()
        result.reasons = [f"g{h['generation']}: {h['reason']}" for h in group.get("history", [])
                          if h["generation"] > result.generation_before]
        kill_group(victim)
        return result
    finally:
        stop_learners(run.cluster, children)


# -- output -------------------------------------------------------------------------------

def spread(values: list[float | None], spec: str = ",.0f") -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    return f"{min(present):{spec}}-{max(present):{spec}}"


def round_efficiencies(windows: dict[int, list[GroupWindow]], n: int) -> list[float | None]:
    """Efficiency at n per round: each round's n-learner window over its own 1-learner one."""
    return [ratio(w.samples_per_s, n * one.samples_per_s) if one.samples_per_s else None
            for w, one in zip(windows[n], windows[1], strict=False)]


def summary_table(windows: dict[int, list[GroupWindow]], batch_size: int, halves: list[Rate],
                  shard_halves: list[Rate], pair: PairCeiling | None) -> Table:
    t = Table(title=f"learner group: samples learned/s (train iterations/s x global batch "
                    f"{batch_size}), DQN MLP {HIDDEN_SIZES}, one torch thread per learner",
              caption="cluster rows: median over rounds (min-max in brackets); efficiency: "
                      "samples/s at n / (n x samples/s at 1 learner); in-process rows: "
                      "DQN.learn from memory, the ceilings in two halves (before / after the "
                      "cluster windows); the bare pair's efficiency is against 2 x the "
                      "in-process ceiling")
    for name, justify in (("configuration", "left"), ("samples/s", "right"),
                          ("train it/s", "right"), ("efficiency", "right"),
                          ("vs n x in-process", "right"), ("all-reduce ms/it", "right"),
                          ("compute ms/it", "right"), ("sample wait ms/it", "right"),
                          ("goal", "right")):
        t.add_column(name, justify=justify)
    ceil = mean_rate(halves).per_s
    one = median(w.samples_per_s for w in windows[1])
    for n in COUNTS:
        ws = windows[n]
        rates = [w.samples_per_s for w in ws]
        its = [w.iterations_per_s for w in ws]
        allreduce = [w.rank_mean("allreduce_ms") for w in ws]
        coord = median(v for w in ws for v in w.coordinator_allreduce_ms)
        t.add_row(f"{n} learner{'s' if n > 1 else ''} (cluster)",
                  f"{fmt(median(rates), ',.0f')} ({spread(rates)})",
                  f"{fmt(median(its), '.1f')} ({spread(its, '.1f')})",
                  f"{fmt(ratio(median(rates), n * one) if one else None, '.2f')} "
                  f"({spread(round_efficiencies(windows, n), '.2f')})",
                  fmt(ratio(median(rates), n * ceil), ".2f"),
                  (f"{fmt(median(allreduce), '.1f')} ({spread(allreduce, '.1f')}); "
                   f"coordinator's {fmt(coord, '.1f')}") if n > 1 else "-",
                  fmt(median(w.rank_mean("compute_ms") for w in ws), ".1f"),
                  fmt(median(w.rank_mean("wait_ms") for w in ws), ".1f"),
                  f">= {EFFICIENCY_GOAL}" if n > 1 else "")
    t.add_section()
    for label, hs, batch in ((f"in-process ceiling, batch {batch_size}", halves, batch_size),
                             (f"in-process, batch {batch_size // 2} (a rank's shard)",
                              shard_halves, batch_size // 2)):
        rate = mean_rate(hs)
        t.add_row(label, f"{rate.per_s:,.0f} ({' / '.join(f'{h.per_s:,.0f}' for h in hs)})",
                  f"{rate.per_s / batch:.1f}", "", "", "", f"{1000 * batch / rate.per_s:.1f}",
                  "", "")
    if pair is not None:
        rate = pair.samples_per_s(batch_size)
        t.add_row("bare pair: 2 processes, DistReducer over gloo, no coordinator",
                  f"{rate:,.0f}", f"{pair.iterations / pair.seconds:.1f}",
                  fmt(ratio(rate, 2 * ceil), ".2f"), fmt(ratio(rate, 2 * ceil), ".2f"),
                  f"{pair.allreduce_ms:.1f}",
                  f"{1000 * pair.seconds / pair.iterations - pair.allreduce_ms:.1f}", "", "")
    return t


def window_table(windows: dict[int, list[GroupWindow]]) -> Table:
    t = Table(title="each measured window (per rank, from its own /status: ms per train "
                    "iteration)",
              caption=f"busy: the rest of the machine used more than {BUSY_OTHERS} cores")
    for name, justify in (("round", "right"), ("learners", "right"), ("gen", "right"),
                          ("stable", "left"), ("samples/s", "right"), ("s", "right"),
                          ("ranks: compute / all-reduce / sample wait / publish ms", "left"),
                          ("CPU during the window", "left")):
        t.add_column(name, justify=justify)
    for w in sorted((w for ws in windows.values() for w in ws),
                    key=lambda w: (w.round, w.generation)):
        ranks = "; ".join(f"{r.worker_id}: {fmt(r.compute_ms)} / {fmt(r.allreduce_ms)} / "
                          f"{fmt(r.wait_ms)} / {fmt(r.publish_ms)}" for r in w.ranks)
        t.add_row(str(w.round), str(w.learners), str(w.generation),
                  "yes" if w.stable else "[red]no[/]", fmt(w.samples_per_s, ",.0f"),
                  fmt(w.seconds, ".1f"), ranks,
                  w.cpu.describe() + (" [yellow]busy[/]" if w.busy else ""))
    return t


def reform_table(reform: Reform | None) -> Table:
    t = Table(title="re-formation after SIGKILL of one of 2 learners (coordinator polled "
                    f"every {REFORM_POLL_S} s)",
              caption="training again: the coordinator's train iterations moved, which "
                      "waits for the survivor to learn on its first sample response (its "
                      "batches_per_request) and report it")
    for name in ("killed", "kill -> new generation", "-> survivor sampling",
                 "-> training again (reform_s)", "generations", "why"):
        t.add_column(name)
    if reform is None:
        t.add_row("not measured", "", "", "", "", "")
        return t
    t.add_row(f"rank {reform.killed_rank} ({reform.killed})",
              fmt(reform.to_generation_s, ".2f", " s"), fmt(reform.to_sampling_s, ".2f", " s"),
              fmt(reform.to_training_s, ".2f", " s"),
              f"{reform.generation_before} -> {reform.generation_after or '?'}",
              "; ".join(reform.reasons) or "-")
    return t


# -- main ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="rounds of 1- and 2-learner windows")
    p.add_argument("--seconds", type=float, default=12.0, help="length of each window")
    p.add_argument("--warmup", type=float, default=6.0,
                   help="seconds a formed group trains before its window starts")
    p.add_argument("--ceiling-s", type=float, default=5.0,
                   help="length of each half of the in-process ceiling")
    p.add_argument("--batch-size", type=int, default=1024, help="the global batch (even): "
                   "large enough that compute, not the all-reduce, dominates a step")
    p.add_argument("--transitions", type=int, default=50_000, help="prefilled transitions")
    p.add_argument("--batches-per-request", type=int, default=None,
                   help="batches one sample response carries (default: the config's)")
    p.add_argument("--kill-rank", type=int, choices=(0, 1), default=1,
                   help="which rank of 2 is killed for the re-formation figure")
    p.add_argument("--reform-timeout-s", type=float, default=60.0)
    p.add_argument("--quick", action="store_true",
                   help="shorter windows and ceilings (about 2 minutes instead of 3)")
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "cartpole-dqn.yaml")
    p.add_argument("--seed", type=int, default=0)
    for hidden in ("--probe-rank", "--probe-port", "--probe-iterations"):
        p.add_argument(hidden, type=int, default=None, help=argparse.SUPPRESS)
    args = common.parse_args(p, argv, SHORT)
    if args.batch_size < 2 or args.batch_size % 2:
        p.error(f"--batch-size={args.batch_size} must be even: 2 ranks split it")
    if args.repeats < 1:
        p.error(f"--repeats={args.repeats} must be at least 1")
    if args.quick:
        args.seconds, args.warmup, args.ceiling_s = 6.0, 3.0, 3.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe_rank is not None:
        probe_rank(args.config, args.probe_rank, args.probe_port, args.probe_iterations,
                   args.seed)
        return 0
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="rlfleet-learners-"))
    name = f"bench-learners-{os.getpid()}"
    storage = str(work / "storage")
    cfg = bench_config(args.config, name, storage, args.transitions, args.batch_size,
                       args.batches_per_request)
    config_path = write_yaml(work / "config.yaml", cfg)
    spec = env_spec(cfg.env)
    batch = args.batch_size
    log(f"work dir {work}; DQN {HIDDEN_SIZES}, batch {batch}, {args.repeats} round(s) of "
        f"{args.seconds:g} s windows after {args.warmup:g} s warm-up")

    windows: dict[int, list[GroupWindow]] = {n: [] for n in COUNTS}
    halves: list[Rate] = []
    shard_halves: list[Rate] = []
    pair: PairCeiling | None = None
    reform: Reform | None = None
    cluster = LocalCluster(config_path, work, storage)
    failed = True
    try:
        with coordinator_up(cluster) as run:
            log(f"prefilling {args.transitions:,} transitions as a collector would...")
            prefill(run.coordinator.url, storage, cfg.name,
                    chunks(spec, args.transitions, args.seed))
            buffered = run.buffer_size()

            def ceiling_half(which: str) -> None:
                log(f"in-process ceiling, {which} half...")
                halves.append(ceiling(cfg, spec, batch, args.ceiling_s, args.seed))
                shard_halves.append(ceiling(cfg, spec, batch // 2, args.ceiling_s / 2,
                                            args.seed))

            log(f"buffer holds {buffered:,} transitions")
            ceiling_half("first")
            for round_ in range(1, args.repeats + 1):
                for n in COUNTS if round_ % 2 else tuple(reversed(COUNTS)):
                    w = measure_group(run, n, round_, batch, args.warmup, args.seconds)
                    windows[n].append(w)
                    log(f"round {round_}, {n} learner(s): {fmt(w.samples_per_s, ',.0f')} "
                        "samples/s"
                        + ("" if w.stable else " [red](the group re-formed in the window)[/]")
                        + (f" [yellow](busy machine: others used {w.cpu.others_cores():.2f} "
                           "cores)[/]" if w.busy else ""))
            ceiling_half("second")
            shard_its = mean_rate(shard_halves).per_s / (batch // 2)
            iterations = max(30, int(args.ceiling_s * shard_its * 0.6))
            log(f"bare pair: 2 processes, {iterations} train iterations each...")
            pair = pair_ceiling(config_path, iterations, args.seed)
            reform = measure_reform(run, args.kill_rank, args.warmup, args.reform_timeout_s)
            log(f"re-formed and training again {fmt(reform.to_training_s, '.2f')} s after "
                "the kill")
            failed = reform.to_training_s is None  # its logs are kept, to say why
    finally:
        for child in cluster.children:  # what the shutdown left of each learner's group
            if child.role == "learner":
                kill_group(child)
        clear_storage(storage, name)
        if failed:
            log(f"[yellow]kept {work} with the processes' logs[/]")
        else:
            shutil.rmtree(work, ignore_errors=True)

    ceil = mean_rate(halves).per_s
    per_n = {n: median(w.samples_per_s for w in windows[n]) for n in COUNTS}
    one = per_n[1]
    allreduce = [w.rank_mean("allreduce_ms") for w in windows[2]]
    others = [w.cpu.others_cores() for ws in windows.values() for w in ws]

    def span(values: list[float | None], digits: int = 1) -> list[float | int | None]:
        present = [v for v in values if v is not None]
        return [rounded(min(present), digits), rounded(max(present), digits)] if present \
            else [None, None]

    result = {
        "samples_per_s": {str(n): rounded(per_n[n], 1) for n in COUNTS},
        "efficiency": {str(n): rounded(ratio(per_n[n], n * one) if one else None)
                       for n in COUNTS},
        "allreduce_ms": rounded(median(allreduce), 2),
        "reform_s": rounded(reform.to_training_s if reform else None, 2),
        "samples_per_s_range": {str(n): span([w.samples_per_s for w in windows[n]])
                                for n in COUNTS},
        "efficiency_range": span(round_efficiencies(windows, 2), 3),
        "allreduce_ms_range": span(allreduce, 2),
        "allreduce_ms_coordinator": rounded(median(
            v for w in windows[2] for v in w.coordinator_allreduce_ms), 2),
        "compute_ms": {str(n): rounded(median(w.rank_mean("compute_ms") for w in windows[n]),
                                       2) for n in COUNTS},
        "sample_wait_ms": {str(n): rounded(median(w.rank_mean("wait_ms") for w in windows[n]),
                                           2) for n in COUNTS},
        "ratio_to_in_process": {str(n): rounded(ratio(per_n[n], n * ceil)) for n in COUNTS},
        "in_process_samples_per_s": rounded(ceil, 1),
        "in_process_samples_per_s_halves": [rounded(h.per_s, 1) for h in halves],
        "in_process_shard_samples_per_s": rounded(mean_rate(shard_halves).per_s, 1),
        "bare_pair_samples_per_s": rounded(pair.samples_per_s(batch) if pair else None, 1),
        "bare_pair_efficiency": rounded(ratio(pair.samples_per_s(batch), 2 * ceil)
                                        if pair else None),
        "bare_pair_allreduce_ms": rounded(pair.allreduce_ms if pair else None, 2),
        "reform_generation_s": rounded(reform.to_generation_s if reform else None, 2),
        "reform_sampling_s": rounded(reform.to_sampling_s if reform else None, 2),
        "reform_killed_rank": args.kill_rank,
        "reform_reasons": reform.reasons if reform else [],
        "windows_stable": all(w.stable for ws in windows.values() for w in ws),
        "others_cores": span(others, 2),
        "batch_size": batch,
        "hidden_sizes": list(HIDDEN_SIZES),
        "batches_per_request": cfg.learner.batches_per_request,
        "buffer_transitions": buffered,
        "seconds": args.seconds,
        "warmup_s": args.warmup,
        "repeats": args.repeats,
        "wall_s": round(time.monotonic() - started, 1),
    }
    report(result, summary_table(windows, batch, halves, shard_halves, pair),
           window_table(windows), reform_table(reform))
    return 0


if __name__ == "__main__":
    run_main(main)
