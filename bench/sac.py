"""Off-policy against on-policy on MuJoCo: SAC beside PPO on HalfCheetah-v5, to 3,000.

Each seed runs `configs/halfcheetah-sac.yaml` and `configs/halfcheetah-ppo.yaml` as clusters
(`rlfleet up`), each until an evaluation reaches 3,000 (the configs' stop value) or its budget
(SAC 300k env steps, PPO 1M: the budgets their configs are measured at). The goal: SAC there
in at most half PPO's env steps, the gap RL-Zoo's tables show at 1M steps.

    python -m bench.sac [--seeds 0 1] [--sac-env-steps 300000] [--ppo-env-steps 1000000]
                        [--eval-every N] [--eval-episodes N] [--learning-starts N]
                        [--sac-hidden 256 256] [--collectors 2] [--work-dir DIR] [--short]

Per run: env steps and wall seconds of the first evaluation at 3,000 ("not reached" within the
budget), the best and the last evaluation. The last line of stdout is one JSON object:
`sac_steps_to_3000`, `ppo_steps_to_3000` (medians over the seeds that got there; null when
none did), `sac_wall_s_to_3000`, `ppo_wall_s_to_3000`, `steps_ratio` (SAC's over PPO's, goal
<= 0.5), `sac_reached`, `ppo_reached` (seeds that got there), `sac_best_return`,
`ppo_best_return` and per-seed `runs`.

Wall time is the wall clock of the run's first evaluation at 3,000 (from the run's own
clock, `metrics.jsonl`): on a machine of few cores SAC's one update per env step is what
limits it, so its wall time says more about the machine than about SAC.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml
from rich.table import Table

from bench.common import (
    REPO_ROOT,
    Evaluated,
    fmt,
    log,
    median,
    parse_args,
    ratio,
    report,
    run_main,
    write_yaml,
)

CONFIGS = {"sac": REPO_ROOT / "configs" / "halfcheetah-sac.yaml",
           "ppo": REPO_ROOT / "configs" / "halfcheetah-ppo.yaml"}
TARGET = 3000.0
GOAL_RATIO = 0.5
FIGURES = ("sac_best_return", "ppo_best_return", "sac_reached", "ppo_reached")
# One seed, evaluations of one episode, SAC learning with 64x64 networks for its last few
# hundred env steps (the rate limiter's min_lead makes it a few hundred updates ahead of the
# collectors first): every code path, in seconds (nothing gets near 3,000).
SHORT = {"seeds": [0], "sac_env_steps": 3_000, "ppo_env_steps": 5_000, "eval_every": 2_000,
         "eval_episodes": 1, "learning_starts": 1_500, "sac_hidden": [64, 64],
         "collectors": 1}


class Result(Evaluated):
    @property
    def reached(self) -> tuple[int, float] | None:
        """(env steps, wall seconds) of the first evaluation at the target."""
        return self.first(lambda r: r >= TARGET)


def budget_config(variant: str, seed: int, env_steps: int, args: argparse.Namespace,
                  work: Path) -> Path:
    data = yaml.safe_load(CONFIGS[variant].read_text())
    data["seed"] = seed
    data["stop"] = {"max_env_steps": env_steps}
    if args.eval_every is not None:
        data["eval"]["every_env_steps"] = args.eval_every
    if args.short:
        # A short run ends when its first evaluation reports (a stop value any return
        # meets), never on a step budget that could come before the evaluation does.
        data["eval"]["stop_value"] = -1e9
        data["stop"] = {"max_env_steps": 100 * env_steps, "max_wall_s": 180}
    if args.eval_episodes is not None:
        data["eval"]["episodes"] = data["eval"]["num_envs"] = args.eval_episodes
    if variant == "sac" and args.learning_starts is not None:
        data["algo"]["random_steps"] = args.learning_starts
        data["buffers"]["replay"]["rate_limit"]["min_size"] = args.learning_starts
    if variant == "sac" and args.sac_hidden is not None:
        data["algo"]["hidden_sizes"] = list(args.sac_hidden)
    if variant == "ppo" and env_steps < data["algo"].get("lr_anneal_rows", 0):
        data["algo"]["lr_anneal_rows"] = env_steps  # annealed over the budget it has
    return write_yaml(work / f"{variant}-s{seed}.yaml", data)


def table(results: list[Result]) -> Table:
    t = Table(title=f"HalfCheetah-v5: SAC beside PPO, env steps to an evaluation of "
              f"{TARGET:,.0f} (goal: SAC in at most {GOAL_RATIO:.0%} of PPO's)")
    for col in ("algorithm", "seed", "steps to 3,000", "wall s to 3,000", "best eval",
                "env steps", "wall s", "outcome"):
        t.add_column(col, justify="left" if col in ("algorithm", "outcome") else "right")
    for r in results:
        hit = r.reached
        t.add_row(r.variant, str(r.seed), fmt(hit[0], ",d") if hit else "not reached",
                  fmt(hit[1], ".0f") if hit else "-", fmt(r.best), fmt(r.env_steps, ",d"),
                  fmt(r.wall_s, ".0f"), r.outcome)
    return t


def summarise(results: list[Result]) -> dict:
    out: dict = {}
    for variant in CONFIGS:
        mine = [r for r in results if r.variant == variant]
        hits = [r.reached for r in mine if r.reached is not None]
        bests = [r.best for r in mine if r.best is not None]
        out[f"{variant}_steps_to_3000"] = median(h[0] for h in hits)
        out[f"{variant}_wall_s_to_3000"] = median(h[1] for h in hits)
        out[f"{variant}_reached"] = f"{len(hits)}/{len(mine)}"
        out[f"{variant}_best_return"] = max(bests) if bests else None
    out["steps_ratio"] = ratio(out["sac_steps_to_3000"], out["ppo_steps_to_3000"])
    out["goal_ratio"] = GOAL_RATIO
    out["runs"] = [{**r.row(), "reached": r.reached, "best": r.best} for r in results]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--sac-env-steps", type=int, default=300_000)
    p.add_argument("--ppo-env-steps", type=int, default=1_000_000)
    p.add_argument("--eval-every", type=int, default=None, help="env steps between "
                   "evaluations (default: the configs')")
    p.add_argument("--eval-episodes", type=int, default=None, help="episodes per "
                   "evaluation (default: the configs' 10)")
    p.add_argument("--learning-starts", type=int, default=None, help="SAC's random steps "
                   "and its buffer's min_size (default: the config's 10,000)")
    p.add_argument("--sac-hidden", type=int, nargs="+", default=None, help="SAC's MLP "
                   "widths (default: the config's 256 256)")
    p.add_argument("--collectors", type=int, default=2)
    p.add_argument("--work-dir", type=Path, default=None, help="run directories (default: a "
                   "temporary one, removed at the end)")
    args = parse_args(p, argv, SHORT)
    budgets = {"sac": args.sac_env_steps, "ppo": args.ppo_env_steps}
    with tempfile.TemporaryDirectory(prefix="rlfleet-bench-sac-") as tmp:
        work = (args.work_dir or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        results: list[Result] = []
        for seed in args.seeds:
            for variant in CONFIGS:
                config = budget_config(variant, seed, budgets[variant], args, work)
                log(f"{variant} seed {seed}: at most {budgets[variant]:,} env steps")
                r = Result.up(variant, seed, config, args.collectors, work / f"{variant}-s{seed}")
                hit = r.reached
                log(f"{variant} seed {seed}: best {fmt(r.best)}, 3,000 at "
                    f"{f'{hit[0]:,} env steps' if hit else 'never'}")
                results.append(r)
        report(summarise(results), table(results))
    return 0


if __name__ == "__main__":
    run_main(main)
