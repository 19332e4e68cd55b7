"""Bit flipping with hindsight experience replay: DQN with HER beside DQN without it, for the
same env steps (the HER paper's first experiment, section 3.1 / figure 1).

Both run `configs/bitflip-her.yaml` in the single-process runner (`rlfleet.single_process`: the
cluster's own coordinator, collector and learner as threads of one process, talking through
an in-process transport and directory storage;
`tests/integration/test_her.py` runs HER through `rlfleet up`), with `n_bits` bits, for
`--env-steps` env steps; without HER only `algo.her` is null. Every `--eval-every` env steps
100 greedy episodes are played: success is the share that reach their goal (the env's
`info["is_success"]`; for bit flipping, exactly the episodes returning more than -n_bits).

    python -m bench.her [--n-bits 15] [--env-steps 30000] [--seeds 0] [--final] [--short]

`--final` also runs HER with the `final` strategy. The last line of stdout is one JSON
object: `success_her` and `success_no_her` (the last evaluation's success, median over
seeds), `env_steps`, `n_bits`, `env_steps_to_0_9_her` (the first evaluation at >= 0.9), and
per-seed curves.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from bench.common import REPO_ROOT, fmt, log, median, parse_args, report, rounded, run_main

CONFIG = REPO_ROOT / "configs" / "bitflip-her.yaml"
# `env_steps_to_0_9_her` is left out: null is its answer when HER never gets to 0.9.
FIGURES = ("success_her", "success_no_her", "env_steps", "best_success_no_her")
# A few bits, a budget past the buffer's min_size (2,000) and two evaluations a run.
SHORT = {"n_bits": 4, "env_steps": 4_000, "eval_every": 2_000}


def variant_config(n_bits: int, env_steps: int, eval_every: int, seed: int,
                   her: str | None):
    """The bench config: `her` is the strategy, or None for plain DQN."""
    from rlfleet.shared.run.config import load_config, parse_config

    data = load_config(CONFIG).model_dump()
    data["seed"] = seed
    data["env"]["kwargs"]["n_bits"] = n_bits
    data["algo"]["her"] = None if her is None else {**data["algo"]["her"], "strategy": her}
    data["eval"].update(every_env_steps=eval_every, episodes=100, stop_value=None)
    data["stop"] = {"max_env_steps": env_steps}
    return parse_config(data, f"{CONFIG.name} for the bench")


def run(n_bits: int, env_steps: int, eval_every: int, seed: int, her: str | None) -> dict:
    from rlfleet.single_process import run_single

    res = run_single(variant_config(n_bits, env_steps, eval_every, seed, her))
    curve = [(e["env_steps"], e["success"]) for e in res.evaluations]
    first = next((steps for steps, success in curve if success >= 0.9), None)
    return {"seed": seed, "her": her, "success": res.eval_success,
            "best_success": max((s for _, s in curve), default=None),
            "env_steps": res.env_steps, "env_steps_to_0_9": first,
            "eval_return": res.eval_return, "train_iterations": res.train_iterations,
            "wall_s": round(res.wall_seconds, 1), "curve": curve}


def table(results: list[dict], n_bits: int) -> Table:
    t = Table(title=f"bit flipping, {n_bits} bits: success of 100 greedy episodes",
              caption="success: at the last evaluation; to 0.9: env steps at the first "
                      "evaluation with success >= 0.9 ('-': never)")
    for name in ("seed", "HER", "success", "best", "to 0.9", "env steps", "eval return",
                 "updates", "wall"):
        t.add_column(name, justify="right")
    for r in results:
        t.add_row(str(r["seed"]), r["her"] or "none", fmt(r["success"], ".2f"),
                  fmt(r["best_success"], ".2f"), fmt(r["env_steps_to_0_9"], ","),
                  fmt(r["env_steps"], ","), fmt(r["eval_return"], ".2f"),
                  fmt(r["train_iterations"], ","), fmt(r["wall_s"], ".1f", " s"))
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-bits", type=int, default=15)
    p.add_argument("--env-steps", type=int, default=30_000)
    p.add_argument("--eval-every", type=int, default=2_500)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--final", action="store_true", help="also HER's 'final' strategy")
    args = parse_args(p, argv, SHORT)

    variants = ["future"] + (["final"] if args.final else []) + [None]
    results = []
    for seed in args.seeds:
        for her in variants:
            log(f"seed {seed}: {args.n_bits} bits, HER {her or 'off'}, "
                f"{args.env_steps:,} env steps...")
            r = run(args.n_bits, args.env_steps, args.eval_every, seed, her)
            log(f"seed {seed}: HER {her or 'off'}: success {fmt(r['success'], '.2f')} after "
                f"{r['env_steps']:,} env steps (>= 0.9 from {fmt(r['env_steps_to_0_9'], ',')})")
            results.append(r)

    def of(her: str | None) -> list[dict]:
        return [r for r in results if r["her"] == her]

    out = {"success_her": rounded(median(r["success"] for r in of("future")), 3),
           "success_no_her": rounded(median(r["success"] for r in of(None)), 3),
           "env_steps": int(median(r["env_steps"] for r in results) or 0),
           "n_bits": args.n_bits,
           "env_steps_to_0_9_her": rounded(median(r["env_steps_to_0_9"]
                                                  for r in of("future")), 0),
           "best_success_no_her": rounded(median(r["best_success"] for r in of(None)), 3)}
    if args.final:
        out["success_her_final"] = rounded(median(r["success"] for r in of("final")), 3)
        out["env_steps_to_0_9_her_final"] = rounded(median(r["env_steps_to_0_9"]
                                                           for r in of("final")), 0)
    out["seeds"] = args.seeds
    out["per_seed"] = results
    report(out, table(results, args.n_bits))
    return 0


if __name__ == "__main__":
    run_main(main)
