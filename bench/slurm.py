"""Time to solve CartPole through a real Slurm cluster, beside `rlfleet up`, in the same run.

The cluster is tests/slurm/cluster.py's: slurmctld and three slurmd nodes on this machine,
each in a network namespace of its own (partition `learn`: n1, the coordinator and the
learner; `collect`: n2 and n3, the collectors). For each seed, `rlfleet slurm submit --wait`
runs the config from the controller's host, as from a login node; then `rlfleet up` runs the
same config, seed and collectors as local processes. Both times run from the command to the
solving evaluation: submit -> solved (the queue, the job starts, every role's start-up and the
training) against launch -> solved. The nodes share this machine's cores, so the ratio is what
Slurm and the hosts apart cost, not what more machines buy.

    PYTHONPATH=tests python -m bench.slurm [--seeds 0 1 2] [--collectors 2] [--stop-value R]
                                           [--short]

Needs root (network namespaces), Slurm's and munge's binaries (`.ci/ensure-slurm`), and
`tests/` on the import path: the cluster is test infrastructure (it builds on the netns
suite's hosts), whose modules import each other as the test suites' roots (`netns.hosts`,
`integration.helpers`), as pytest puts them. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from bench.common import emit, fmt, log, median, parse_args, ratio, report, rounded, run_main
from bench.time_to_solve import CONFIGS, EASY_TARGET, adjusted_config, run_cluster

FIGURES = ("slurm_solve_s", "local_solve_s", "ratio", "submit_to_first_chunk_s",
           "local_first_chunk_s", "slurm_run_s", "local_run_s", "cluster_start_s")
SHORT = {"seeds": [0], "stop_value": EASY_TARGET}
# The test suites the Slurm cluster's modules import as top-level packages, from tests/.
TEST_ROOTS = ("slurm", "netns", "integration", "chaos")
PARTITIONS = {"learn": "Nodes=n1 Default=YES MaxTime=INFINITE State=UP",
              "collect": "Nodes=n2,n3 MaxTime=INFINITE State=UP LLN=YES"}


@dataclass
class Result:
    seed: int
    solved: bool
    solve_s: float | None  # the command -> the solving evaluation
    first_chunk_s: float | None  # the command -> the first chunk
    run_s: float | None  # the coordinator's start -> the solving evaluation
    env_steps: int | None


def run_slurm(cluster, config: Path, seed: int, collectors: int, run_dir: Path) -> Result:
    done = cluster.run(sys.executable, "-m", "rlfleet", "slurm", "submit", "--config",
                       str(config), "--run-dir", str(run_dir), "--collectors",
                       str(collectors), "--seed", str(seed), "--partition", "learn",
                       "--collector-partition", "collect", "--wait", "--quiet", check=False,
                       timeout=1800)
    path = run_dir / "summary.json"
    if not path.exists():
        log(f"[red]seed {seed}: slurm submit exited {done.returncode} with no summary:[/]\n"
            f"{done.stderr[-2000:]}")
        return Result(seed, False, None, None, None, None)
    s = json.loads(path.read_text())
    return Result(seed, bool(s["solved"]), s.get("solve_s_from_submit"),
                  s.get("first_chunk_s_from_submit"), s["run_seconds"] if s["solved"] else None,
                  s["env_steps"])


def run_local(config: Path, seed: int, collectors: int, run_dir: Path) -> Result:
    c = run_cluster(config, seed, collectors, run_dir, None)
    summary = json.loads((run_dir / "summary.json").read_text()) \
        if (run_dir / "summary.json").exists() else {}
    launch_to_coordinator = None
    if summary.get("first_chunk_s_from_launch") is not None and \
            summary.get("first_chunk_seconds") is not None:
        launch_to_coordinator = (summary["first_chunk_s_from_launch"]
                                 - summary["first_chunk_seconds"])
    solve = (launch_to_coordinator + c.run_s
             if c.solved and c.run_s is not None and launch_to_coordinator is not None else None)
    return Result(seed, c.solved, solve, summary.get("first_chunk_s_from_launch"), c.run_s,
                  c.env_steps)


def table(slurm: list[Result], local: list[Result], med: dict, stop_value: float) -> Table:
    t = Table(title=f"time to solve (eval return >= {stop_value:g}): Slurm vs rlfleet up",
              caption="solve: the command -> the solving evaluation (Slurm: `rlfleet slurm "
                      "submit`, the queue included; local: `rlfleet up`); run: the "
                      "coordinator's start -> the solving evaluation; goal: ratio <= 1.3")
    for name in ("seed", "slurm solve", "local solve", "ratio", "slurm first chunk",
                 "local first chunk", "slurm run", "local run", "slurm env steps",
                 "local env steps"):
        t.add_column(name, justify="right")
    for s, c in zip(slurm, local, strict=True):
        t.add_row(str(s.seed), fmt(s.solve_s, ".1f", " s"), fmt(c.solve_s, ".1f", " s"),
                  fmt(ratio(s.solve_s, c.solve_s), ".2f", "x"),
                  fmt(s.first_chunk_s, ".1f", " s"), fmt(c.first_chunk_s, ".1f", " s"),
                  fmt(s.run_s, ".1f", " s"), fmt(c.run_s, ".1f", " s"),
                  fmt(s.env_steps, ","), fmt(c.env_steps, ","))
    t.add_section()
    t.add_row("median", fmt(med["slurm_solve_s"], ".1f", " s"),
              fmt(med["local_solve_s"], ".1f", " s"), fmt(med["ratio"], ".2f", "x"),
              fmt(med["submit_to_first_chunk_s"], ".1f", " s"),
              fmt(med["local_first_chunk_s"], ".1f", " s"), fmt(med["slurm_run_s"], ".1f", " s"),
              fmt(med["local_run_s"], ".1f", " s"), "", "", style="bold")
    return t


def main(argv: list[str] | None = None) -> int:
    try:
        from slurm.cluster import SlurmCluster, unavailable
    except ModuleNotFoundError as err:
        if err.name not in TEST_ROOTS:
            raise
        why = f"no module {err.name!r}: run with tests/ on the path, PYTHONPATH=tests"
        log(f"[red]{why}[/]")
        emit({"error": why})
        return 1

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--collectors", type=int, default=2)
    ap.add_argument("--algo", choices=sorted(CONFIGS), default="dqn")
    ap.add_argument("--stop-value", type=float, default=None,
                    help="default: the config's (475)")
    args = parse_args(ap, argv, SHORT)
    why = unavailable()
    if why:
        log(f"[red]no Slurm cluster can be built here: {why}[/]")
        emit({"error": why})
        return 1
    with tempfile.TemporaryDirectory(prefix="rlfleet-slurm-bench-") as tmp:
        work = Path(tmp)
        config = adjusted_config(CONFIGS[args.algo], work, args.stop_value)
        stop_value = args.stop_value or 475.0
        cluster = SlurmCluster(work / "cluster", partitions=PARTITIONS)
        slurm: list[Result] = []
        local: list[Result] = []
        try:
            t0 = time.monotonic()
            cluster.start()
            start_s = time.monotonic() - t0
            log(f"Slurm {cluster.names} up in {start_s:.1f} s")
            for seed in args.seeds:  # Slurm then local, per seed: drift hits both alike
                log(f"seed {seed}: rlfleet slurm submit --wait ...")
                slurm.append(run_slurm(cluster, config, seed, args.collectors,
                                       work / f"slurm-{seed}"))
                log(f"seed {seed}: rlfleet up ...")
                local.append(run_local(config, seed, args.collectors, work / f"local-{seed}"))
        finally:
            hard = cluster.close()
            if hard:
                log(f"[yellow]killed hard at the end: {hard}[/]")
    med = {"slurm_solve_s": median(r.solve_s for r in slurm),
           "local_solve_s": median(r.solve_s for r in local),
           "submit_to_first_chunk_s": median(r.first_chunk_s for r in slurm),
           "local_first_chunk_s": median(r.first_chunk_s for r in local),
           "slurm_run_s": median(r.run_s for r in slurm),
           "local_run_s": median(r.run_s for r in local)}
    med["ratio"] = ratio(med["slurm_solve_s"], med["local_solve_s"])
    report({**{k: rounded(v) for k, v in med.items()}, "cluster_start_s": rounded(start_s),
            "seeds": args.seeds, "collectors": args.collectors, "algo": args.algo,
            "stop_value": stop_value,
            "slurm_solved": sum(r.solved for r in slurm),
            "local_solved": sum(r.solved for r in local),
            "slurm_solve_s_each": [rounded(r.solve_s) for r in slurm],
            "local_solve_s_each": [rounded(r.solve_s) for r in local]},
           table(slurm, local, med, stop_value))
    return 0


if __name__ == "__main__":
    run_main(main)
