"""A partially observable env: R2D2 beside DQN on CartPole with its velocities hidden.

`rlfleet/CartPoleNoVel-v0` shows x and theta only. R2D2 (`configs/cartpolenovel-r2d2.yaml`)
remembers what it saw in its LSTM; DQN (`configs/cartpolenovel-dqn.yaml`, CartPole's DQN)
sees one observation at a time. Per seed, R2D2 runs first, until it solves (evaluation >=
475) or spends `--env-steps`; DQN then gets exactly the env steps R2D2 used, so the two are
compared over the same experience.

    python -m bench.pomdp [--seeds 0 1] [--env-steps 250000] [--collectors 2]
                          [--work-dir DIR] [--short]

Per run: the env steps of the first evaluation at 475 (or "not reached"), the best and the
last evaluation, env steps and wall seconds. The last line of stdout is one JSON object:
`solved_rate_r2d2`, `solved_rate_dqn` (the share of seeds solved), `best_return_r2d2`,
`best_return_dqn` (the best evaluation over all seeds), `env_steps` (the budget),
`r2d2_steps_to_475` (the median over seeds, null if none solved) and per-seed `runs`.
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
    report,
    run_main,
    write_yaml,
)

CONFIGS = {"r2d2": REPO_ROOT / "configs" / "cartpolenovel-r2d2.yaml",
           "dqn": REPO_ROOT / "configs" / "cartpolenovel-dqn.yaml"}
SOLVED = 475.0
FIGURES = ("solved_rate_r2d2", "solved_rate_dqn", "best_return_r2d2", "best_return_dqn",
           "env_steps")
# One seed and a budget of two evaluations: the same code, in seconds.
SHORT = {"seeds": [0], "env_steps": 2_000, "eval_every": 1_000, "collectors": 1}


class Result(Evaluated):
    @property
    def solved_at(self) -> int | None:
        hit = self.first(lambda r: r >= SOLVED)
        return hit[0] if hit else None


def budget_config(variant: str, seed: int, env_steps: int, eval_every: int | None,
                  work: Path, short: bool = False) -> Path:
    data = yaml.safe_load(CONFIGS[variant].read_text())
    data["seed"] = seed
    data["stop"] = {"max_env_steps": env_steps, "max_wall_s": 3600}
    if eval_every is not None:
        data["eval"]["every_env_steps"] = eval_every
    if short:  # ends on its first evaluation, never on a budget that could come first
        data["eval"]["stop_value"] = -1e9
        data["stop"] = {"max_env_steps": 100 * env_steps, "max_wall_s": 180}
    return write_yaml(work / f"{variant}-s{seed}.yaml", data)


def table(results: list[Result]) -> Table:
    t = Table(title=f"rlfleet/CartPoleNoVel-v0: R2D2, then DQN over the env steps R2D2 used "
              f"(solved: an evaluation >= {SOLVED:g})")
    for col in ("algorithm", "seed", "solved at", "best eval", "last eval", "env steps",
                "wall s", "outcome"):
        t.add_column(col, justify="left" if col in ("algorithm", "outcome") else "right")
    for r in results:
        t.add_row(r.variant, str(r.seed),
                  fmt(r.solved_at, ",d") if r.solved_at is not None else "not reached",
                  fmt(r.best), fmt(r.last), fmt(r.env_steps, ",d"), fmt(r.wall_s, ".0f"),
                  r.outcome)
    return t


def summarise(results: list[Result], env_steps: int) -> dict:
    out: dict = {}
    for variant in CONFIGS:
        mine = [r for r in results if r.variant == variant]
        bests = [r.best for r in mine if r.best is not None]
        out[f"solved_rate_{variant}"] = (round(sum(r.solved_at is not None for r in mine)
                                               / len(mine), 3) if mine else None)
        out[f"best_return_{variant}"] = max(bests) if bests else None
    out["env_steps"] = env_steps
    out["r2d2_steps_to_475"] = median(r.solved_at for r in results
                                      if r.variant == "r2d2" and r.solved_at is not None)
    out["runs"] = [{**r.row(), "solved_at": r.solved_at, "best": r.best, "last": r.last}
                   for r in results]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--env-steps", type=int, default=250_000,
                   help="R2D2's budget; DQN gets the env steps R2D2 used")
    p.add_argument("--eval-every", type=int, default=None, help="env steps between "
                   "evaluations (default: the configs')")
    p.add_argument("--collectors", type=int, default=2)
    p.add_argument("--work-dir", type=Path, default=None, help="run directories (default: a "
                   "temporary one, removed at the end)")
    args = parse_args(p, argv, SHORT)
    with tempfile.TemporaryDirectory(prefix="rlfleet-bench-pomdp-") as tmp:
        work = (args.work_dir or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        results: list[Result] = []
        for seed in args.seeds:
            budget = args.env_steps
            for variant in CONFIGS:
                config = budget_config(variant, seed, budget, args.eval_every, work, args.short)
                log(f"{variant} seed {seed}: at most {budget:,} env steps")
                r = Result.up(variant, seed, config, args.collectors, work / f"{variant}-s{seed}")
                log(f"{variant} seed {seed}: best {fmt(r.best)}, solved at "
                    f"{r.solved_at if r.solved_at is not None else 'never'}")
                results.append(r)
                if variant == "r2d2" and r.env_steps:
                    budget = r.env_steps  # DQN gets the same experience
        report(summarise(results, args.env_steps), table(results))
    return 0


if __name__ == "__main__":
    run_main(main)
