"""Env steps/s with 1, 2, 4, 8 and 16 collectors on an env whose step takes a fixed time.

The env is `bench.slow_env:SlowCartPole`: CartPole-v1 whose step sleeps `step_s` (2 ms), a
stand-in for a slow simulator. Its step costs wall time, not CPU, so on a small machine the
collectors' own work (inference, chunk encoding and writing, reporting) and the coordinator's
are what can keep the fleet from scaling linearly, and that is what this bench is about.

For each collector count N a fresh cluster is started (coordinator and N collectors at nice 0,
directory storage), with no replay-ratio throttling (`samples_per_insert: null`), no
evaluations and no stop rule. No learner: DQN collectors act with their initial weights when
no policy is published, so collection needs none, and a free-running learner would take a
whole core of the two this machine has, which would measure how collectors share cores with
a learner rather than how collection scales. When every collector has registered and reported
env steps, and after a short warm-up, env steps/s are read from the coordinator's counters
(`GET /api/v1/status` -> counters.env_steps) at the two ends of a `--seconds` window; then the
cluster is stopped before the next N.

    efficiency(N) = steps_per_s(N) / (N * steps_per_s(1))

Ceiling: a synchronous vector env steps its `num_envs` envs one after the other, so one vector
step takes at least `num_envs * step_s` and yields `num_envs` env steps: at most
`1 / step_s` env steps/s per collector, whatever `num_envs` is (500/s at 2 ms). `time.sleep`
overshoots a little, so even a perfect collector stays some percent below it.

    python -m bench.scaling [--collectors 1 2 4 8 16] [--seconds 10] [--step-s 0.002] [--short]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from bench.common import (
    REPO_ROOT,
    CpuWindow,
    LocalRun,
    WaitTimeout,
    clear_storage,
    coordinator_up,
    counter_rate,
    fmt,
    free_running_data,
    log,
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
from rlfleet.local.launcher import Child, ChildFailed, LocalCluster
from rlfleet.shared.infra.http import HttpError
from rlfleet.shared.run.config import RunConfig, parse_config

SLOW_ENV = "bench.slow_env:SlowCartPole"
GOAL = 0.9  # efficiency the goal asks for, up to 16 collectors
# Each holds one value per collector count.
FIGURES = ("steps_per_s", "efficiency", "vs_ceiling", "collectors_own_sum", "cpu_cores",
           "start_s")
# The base and one count above it (an efficiency needs two), over 2 s windows.
SHORT = {"collectors": [1, 2], "seconds": 2.0, "warmup": 1.0}


def bench_config(base: Path, name: str, storage: str, step_s: float, num_envs: int,
                 chunk_size: int, epsilon: float) -> RunConfig:
    """The base config on the slow env, made free-running: no replay-ratio throttling, no
    evaluations, no stop rule; small chunks so the counter moves often. Epsilon is constant:
    with the base config's schedule (decaying over the run's global env steps) 16 collectors
    would act greedily, running the network, far sooner than one, and the CPU per env step
    would differ between collector counts."""
    data = free_running_data(base, name, storage, epsilon)
    data["env"].update(id=SLOW_ENV, kwargs={"step_s": step_s}, num_envs=num_envs)
    data["collector"]["chunk_size"] = chunk_size
    return parse_config(data, "scaling bench config")


# -- one collector count ------------------------------------------------------------------

@dataclass
class Point:
    """One collector count's window, or why it has none."""
    n: int
    steps_per_s: float | None = None
    per_collector: list[float] = field(default_factory=list)  # each one's own steps/s
    cpu: CpuWindow | None = None
    start_s: float | None = None   # from the first spawn until every collector reported steps
    error: str | None = None

    def cores(self, prefix: str) -> float | None:
        if self.cpu is None:
            return None
        return sum(self.cpu.cores(k) for k in self.cpu.used if k.startswith(prefix))


def collector_steps(children: list[Child]) -> list[int | None]:
    """Each collector's own env step count (its /status), None where it does not answer."""
    steps = [worker_status(child).get("env_steps") for child in children]
    return [None if n is None else int(n) for n in steps]


def wait_collecting(run: LocalRun, children: list[Child], timeout_s: float) -> None:
    """Until every collector is registered, alive and has reported env steps (through its
    heartbeat status), so the window sees the whole fleet at work and none still starting."""
    def collecting() -> bool:
        dead = run.cluster.crashed()
        if dead is not None:
            raise ChildFailed(f"{dead.name} exited with code {dead.proc.returncode}; last "
                              f"lines of {dead.log_path}:\n{dead.tail(8)}")
        working = [w for w in run.status()["workers"]
                   if w["role"] == "collector" and w["state"] == "alive"
                   and (w.get("status") or {}).get("env_steps", 0) > 0]
        return len(working) >= len(children)

    wait_for(collecting, timeout_s, f"{len(children)} collectors collecting", interval_s=0.25)


def measure(n: int, cfg: RunConfig, work: Path, seconds: float, warmup: float,
            start_timeout_s: float) -> Point:
    """A fresh cluster with `n` collectors: its env steps/s over one window, then stopped."""
    run_dir = work / f"n{n}"
    run_dir.mkdir()
    storage = str(run_dir / "storage")
    cfg = cfg.with_overrides(name=f"{cfg.name}-n{n}", storage=storage)
    cluster = LocalCluster(write_yaml(run_dir / "config.yaml", cfg), run_dir, storage,
                           collector_nice=0)
    point = Point(n)
    try:
        with coordinator_up(cluster) as run:
            t_spawn = time.monotonic()
            children = [cluster.add_collector() for _ in range(n)]
            wait_collecting(run, children, start_timeout_s)
            point.start_s = time.monotonic() - t_spawn
            log(f"N={n}: all collecting after {point.start_s:.1f} s; warm-up {warmup:g} s, "
                f"then {seconds:g} s window...")
            time.sleep(warmup)
            pids = {"coordinator": run.coordinator.proc.pid} | {c.name: c.proc.pid
                                                                 for c in children}
            cpu = CpuWindow(pids)
            own0 = collector_steps(children)
            rate = counter_rate(run, "env_steps", seconds, cpu)
            own1 = collector_steps(children)
            point.cpu = cpu
            point.steps_per_s = rate.per_s
            point.per_collector = [(b - a) / rate.seconds
                                   for a, b in zip(own0, own1, strict=True)
                                   if a is not None and b is not None]
            if (dead := cluster.crashed()) is not None:
                point.error = f"{dead.name} exited during the window"
    except (ChildFailed, HttpError, WaitTimeout) as err:
        point.error = str(err).splitlines()[0]
        log(f"[red]N={n}: {err}[/]")
    finally:
        clear_storage(storage, cfg.name)
    return point


# -- output -------------------------------------------------------------------------------

def report_table(points: list[Point], base: float | None, ceiling: float, step_s: float,
                 num_envs: int, seconds: float) -> Table:
    t = Table(title=f"env steps/s by collector count: {num_envs} envs per collector, each step "
                    f"sleeping {step_s * 1000:g} ms, {seconds:g} s windows",
              caption=f"ideal linear: N x the measured 1-collector figure; efficiency: measured "
                      f"/ ideal linear (goal >= {GOAL}). Own sum, each: the collectors' own "
                      "rates from their /status, counted when a chunk is cut, before it is "
                      "reported (a sum above steps/s means reports lag). Ceiling per collector, "
                      "synchronous "
                      f"vector env: num_envs / (num_envs x step_s) = {ceiling:,.0f} steps/s. "
                      f"CPU: cores used during the window, of {os.cpu_count()}; others: the "
                      "rest of the machine.")
    for name in ("N", "steps/s", "ideal linear", "efficiency", "vs ceiling", "own sum",
                 "each (min-max)", "CPU coord.", "CPU collectors", "CPU others", "start-up",
                 "note"):
        t.add_column(name, justify="left" if name == "note" else "right")
    for p in points:
        ideal = None if base is None else p.n * base
        own = (f"{min(p.per_collector):,.0f}-{max(p.per_collector):,.0f}"
               if p.per_collector else "-")
        cpu = p.cpu
        t.add_row(str(p.n), fmt(p.steps_per_s, ",.0f"), fmt(ideal, ",.0f"),
                  fmt(ratio(p.steps_per_s, ideal), ".2f"),
                  fmt(ratio(p.steps_per_s, p.n * ceiling), ".2f"),
                  fmt(sum(p.per_collector) if p.per_collector else None, ",.0f"), own,
                  fmt(p.cores("coordinator"), ".2f"), fmt(p.cores("collector-"), ".2f"),
                  fmt(cpu.others_cores() if cpu else None, ".2f"),
                  fmt(p.start_s, ".1f", " s"), p.error or "")
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collectors", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                   help="collector counts to measure (1 should be among them: it is the base)")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each measured window")
    p.add_argument("--warmup", type=float, default=3.0,
                   help="seconds the fleet collects before its window starts")
    p.add_argument("--step-s", type=float, default=0.002, help="seconds each env step sleeps")
    # 16 envs per collector: the policy's forward pass is shared by all of a collector's envs,
    # so CPU per env step falls (about 290 us at 4 envs, 60 us at 16 on this machine) while
    # the per-collector ceiling stays 1/step_s; with 4, sixteen collectors need more than the
    # two cores here and efficiency drops to about 0.7.
    p.add_argument("--num-envs", type=int, default=16, help="envs per collector's vector env")
    p.add_argument("--chunk-size", type=int, default=64, help="transitions per chunk")
    p.add_argument("--epsilon", type=float, default=0.1, help="collectors' constant epsilon")
    p.add_argument("--start-timeout", type=float, default=240.0,
                   help="seconds N collectors may take to all be collecting")
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "cartpole-dqn.yaml")
    args = parse_args(p, argv, SHORT)

    counts = sorted(set(args.collectors))
    work = Path(tempfile.mkdtemp(prefix="rlfleet-scaling-"))
    cfg = bench_config(args.config, f"bench-scaling-{os.getpid()}", str(work / "storage"),
                       args.step_s, args.num_envs, args.chunk_size, args.epsilon)
    ceiling = 1.0 / args.step_s  # num_envs / (num_envs * step_s)
    log(f"collector counts {counts}, {args.seconds:g} s windows, {args.warmup:g} s warm-up, "
        f"work dir {work}")

    points: list[Point] = []
    for n in counts:
        log(f"N={n}: starting a coordinator and {n} collector(s)...")
        point = measure(n, cfg, work, args.seconds, args.warmup, args.start_timeout)
        points.append(point)
        if point.steps_per_s is not None:
            log(f"N={n}: {point.steps_per_s:,.0f} env steps/s "
                f"({point.cpu.describe() if point.cpu else ''})")
    failed = [pt for pt in points if pt.error]
    if failed:
        progress.print(f"work dir with the workers' logs kept: {work}", markup=False)
    else:
        shutil.rmtree(work, ignore_errors=True)

    base = next((pt.steps_per_s for pt in points if pt.n == 1), None)

    def cores(pt: Point) -> dict[str, float] | None:
        if pt.cpu is None:
            return None
        return {"coordinator": round(pt.cores("coordinator") or 0.0, 3),
                "collectors": round(pt.cores("collector-") or 0.0, 3),
                "bench": round(pt.cpu.cores("bench"), 3),
                "others": round(pt.cpu.others_cores(), 3)}

    report({
        "steps_per_s": {str(pt.n): rounded(pt.steps_per_s, 1) for pt in points},
        "efficiency": {str(pt.n): rounded(ratio(pt.steps_per_s, None if base is None
                                                else pt.n * base)) for pt in points},
        "vs_ceiling": {str(pt.n): rounded(ratio(pt.steps_per_s, pt.n * ceiling))
                       for pt in points},
        "collectors_own_sum": {str(pt.n): rounded(sum(pt.per_collector), 1)
                               for pt in points if pt.per_collector},
        "per_collector_min_max": {str(pt.n): [rounded(min(pt.per_collector), 1),
                                              rounded(max(pt.per_collector), 1)]
                                  for pt in points if pt.per_collector},
        "cpu_cores": {str(pt.n): cores(pt) for pt in points},
        "start_s": {str(pt.n): rounded(pt.start_s, 1) for pt in points},
        "errors": {str(pt.n): pt.error for pt in points if pt.error},
        "ceiling_per_collector": ceiling,
        "step_s": args.step_s,
        "num_envs": args.num_envs,
        "chunk_size": args.chunk_size,
        "epsilon": args.epsilon,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "cpu_count": os.cpu_count(),
    }, report_table(points, base, ceiling, args.step_s, args.num_envs, args.seconds))
    return 1 if failed else 0


if __name__ == "__main__":
    run_main(main)
