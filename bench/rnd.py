"""Random Network Distillation on MountainCar-v0: plain DQN beside DQN + RND, same budget.

MountainCar pays -1 a step until the car reaches the flag, and an episode ends there or after
200 steps, so until it first gets there every return is -200. The goal is reached when an
evaluation (`eval.episodes` deterministic episodes, every `eval.every_env_steps`) has a mean
return above -200: some episode got to the flag. `configs/mountaincar-dqn.yaml` and
`configs/mountaincar-rnd.yaml` differ only in `algo.reward_model`.

    python -m bench.rnd [--seeds 0 1 2 3 4] [--env-steps 30000] [--mode up|single]
                        [--collectors 1] [--work-dir DIR] [--figure PNG] [--short]

`--mode up` (the default) runs each config and seed as a cluster (`rlfleet up`, one collector
of 4 envs) and draws every run's curves into `--figure` with `rlfleet plot`; `--mode single`
runs the single-process runner instead (the same code, no HTTP or storage; no figure). A run
that reaches the config's stop value (-110, gymnasium's threshold) stops there, solved.

Per seed and config: the best evaluation's mean return, the env steps of the first evaluation
above -200 (the goal), and the last evaluation; then the share of seeds that reached the goal
within smaller budgets, read from the same runs. The last line of stdout is one JSON object:
`goal_rate_rnd`, `goal_rate_dqn` (the share of seeds whose evaluations reached the goal
within `env_steps`), `best_return_rnd`, `best_return_dqn` (the best evaluation over all seeds),
`env_steps`, `goal_rate_by_env_steps` ({budget: {rnd, dqn}}) and per-seed `runs`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.table import Table

from bench.common import (
    REPO_ROOT,
    Evaluated,
    fmt,
    log,
    parse_args,
    report,
    run_main,
    write_yaml,
)

CONFIGS = {"dqn": REPO_ROOT / "configs" / "mountaincar-dqn.yaml",
           "rnd": REPO_ROOT / "configs" / "mountaincar-rnd.yaml"}
GOAL = -200.0  # an evaluation's mean return above this: some episode reached the flag
FIGURE = REPO_ROOT / "bench" / "figures" / "mountaincar-rnd.png"
FIGURES = ("goal_rate_rnd", "goal_rate_dqn", "best_return_rnd", "best_return_dqn", "env_steps",
           "goal_rate_by_env_steps")
# One seed, two evaluations a run; the curves go to the work dir, not over bench/figures/.
SHORT = {"seeds": [0], "env_steps": 5_000, "figure": None}


@dataclass
class Result(Evaluated):
    run_dir: str | None = None

    @property
    def goal_at(self) -> int | None:
        """Env steps of the first evaluation above the goal line."""
        hit = self.first(lambda r: r > GOAL)
        return hit[0] if hit else None


def budget_config(variant: str, seed: int, env_steps: int, work: Path) -> Path:
    data = yaml.safe_load(CONFIGS[variant].read_text())
    data["seed"] = seed
    data["stop"] = {"max_env_steps": env_steps}
    return write_yaml(work / f"mountaincar-{variant}-s{seed}.yaml", data)


def run_cluster(variant: str, seed: int, config: Path, collectors: int, work: Path) -> Result:
    run_dir = work / f"mountaincar-{variant}-s{seed}"
    return Result.up(variant, seed, config, collectors, run_dir, run_dir=str(run_dir))


def run_single_process(variant: str, seed: int, config: Path) -> Result:
    from rlfleet.shared.run.config import load_config
    from rlfleet.single_process import run_single

    result = Result(variant, seed)
    res = run_single(load_config(config), progress=lambda s, i, r, t:
                     result.evaluations.append((s, r, t)))
    result.env_steps, result.wall_s = res.env_steps, res.wall_seconds
    result.outcome = "solved" if res.solved else "budget"
    return result


def table(results: list[Result], env_steps: int) -> Table:
    t = Table(title=f"MountainCar-v0, {env_steps:,} env steps: DQN beside DQN + RND "
              f"(goal: an evaluation above {GOAL:g})")
    for col in ("config", "seed", "goal reached at", "best eval", "last eval", "env steps",
                "wall s", "outcome"):
        t.add_column(col, justify="left" if col in ("config", "outcome") else "right")
    for r in results:
        t.add_row(f"mountaincar-{r.variant}", str(r.seed),
                  fmt(r.goal_at, ",d") if r.goal_at is not None else "not reached",
                  fmt(r.best), fmt(r.last), fmt(r.env_steps, ",d"), fmt(r.wall_s, ".0f"),
                  r.outcome)
    return t


def checkpoints(env_steps: int) -> list[int]:
    """Budgets within the run's at which goal rates are also counted: every 5,000 env steps
    from 10,000 (the same runs, read at smaller budgets)."""
    return [b for b in range(10_000, env_steps, 5_000)] + [env_steps]


def goal_rate(results: list[Result], variant: str, budget: int) -> float | None:
    mine = [r for r in results if r.variant == variant]
    reached = [r for r in mine if r.goal_at is not None and r.goal_at <= budget]
    return round(len(reached) / len(mine), 3) if mine else None


def rates_table(results: list[Result], env_steps: int) -> Table:
    t = Table(title="share of seeds whose evaluations reached the goal within a budget")
    t.add_column("env steps", justify="right")
    for variant in CONFIGS:
        t.add_column(f"mountaincar-{variant}", justify="right")
    for budget in checkpoints(env_steps):
        t.add_row(f"{budget:,}", *(fmt(goal_rate(results, v, budget), ".0%")
                                   if goal_rate(results, v, budget) is not None else "-"
                                   for v in CONFIGS))
    return t


def summarise(results: list[Result], env_steps: int) -> dict:
    out: dict = {}
    for variant in CONFIGS:
        bests = [r.best for r in results if r.variant == variant and r.best is not None]
        out[f"goal_rate_{variant}"] = goal_rate(results, variant, env_steps)
        out[f"best_return_{variant}"] = max(bests) if bests else None
    out["env_steps"] = env_steps
    out["goal_rate_by_env_steps"] = {str(b): {v: goal_rate(results, v, b) for v in CONFIGS}
                                     for b in checkpoints(env_steps)}
    out["runs"] = [{**r.row(), "goal_at": r.goal_at, "best": r.best, "last": r.last}
                   for r in results]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--env-steps", type=int, default=30_000, help="the budget of every run")
    p.add_argument("--mode", choices=("up", "single"), default="up")
    p.add_argument("--collectors", type=int, default=1)
    p.add_argument("--work-dir", type=Path, default=None, help="run directories (default: a "
                   "temporary one, removed at the end)")
    p.add_argument("--figure", type=Path, default=FIGURE, help="--mode up: both configs' "
                   "curves, drawn by rlfleet plot (with --short: into the work dir)")
    args = parse_args(p, argv, SHORT)
    with tempfile.TemporaryDirectory(prefix="rlfleet-bench-rnd-") as tmp:
        work = (args.work_dir or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        results: list[Result] = []
        for seed in args.seeds:
            for variant in CONFIGS:
                config = budget_config(variant, seed, args.env_steps, work)
                log(f"{variant} seed {seed}: {args.env_steps:,} env steps ({args.mode})")
                r = (run_cluster(variant, seed, config, args.collectors, work)
                     if args.mode == "up"
                     else run_single_process(variant, seed, config))
                log(f"{variant} seed {seed}: best {fmt(r.best)}, goal at "
                    f"{r.goal_at if r.goal_at is not None else 'never'}")
                results.append(r)
        if args.mode == "up":
            dirs = [r.run_dir for r in results if r.run_dir]
            figure = args.figure or work / FIGURE.name
            done = subprocess.run([sys.executable, "-m", "rlfleet", "plot", *dirs,
                                   "--out", str(figure)], cwd=REPO_ROOT,
                                  capture_output=True, text=True)
            log(done.stdout.strip() if done.returncode == 0 else
                f"[red]rlfleet plot failed: {done.stderr.strip()[-500:]}[/]")
        report(summarise(results, args.env_steps), table(results, args.env_steps),
               rates_table(results, args.env_steps))
    return 0


if __name__ == "__main__":
    run_main(main)
