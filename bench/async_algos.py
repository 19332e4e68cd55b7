"""PPO against APPO when collectors, not the cores, set the pace: time to solve, env steps to
solve, and the share of what the collectors collected that the learner learned from.

Both runs are CartPole-v1 through `rlfleet up` with `--collectors 4` whose env sleeps
`--step-ms` per step (`bench.slow_env:SlowCartPole`, as the compose and scaling benches slow
it): wall time, not the 2 cores, limits what the collectors send, as with a real simulator.
PPO is `configs/cartpole-ppo.yaml` (it drops chunks more than `max_policy_lag` versions old,
learner and coordinator alike); APPO is `configs/cartpole-appo.yaml` (V-trace, nothing dropped
for its age). Each seed runs both, one after the other, in this sitting.

Per run (`bench.time_to_solve.run_cluster`): time to solve is the coordinator's clock from
the first chunk accepted to the solving evaluation (workers' start-up left out); env steps to
solve are those reported at the solving evaluation. The share learned from is, at the run's
end, the rows the learner learned on (chunks consumed from the queue, less the ones its feed
dropped as stale) over the env steps collected; the rest were dropped by the coordinator or
the learner for their age, or were still queued when the run stopped.

    python -m bench.async_algos [--seeds 0 1 2 3 4] [--step-ms 1] [--collectors 4] [--short]

Goal: APPO learns from >= 0.95 of what is collected and solves no later in wall time than
PPO. The last line of stdout is one JSON object: `appo_solve_s`, `ppo_solve_s`,
`appo_used_fraction`, `ppo_used_fraction` (medians over seeds; a seed that did not solve
counts as not solved), with the env steps to solve and every run's figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from rich.table import Table

from bench.common import (
    REPO_ROOT,
    fmt,
    log,
    median,
    parse_args,
    report,
    rounded,
    run_main,
    write_yaml,
)
from bench.time_to_solve import run_cluster
from rlfleet.shared.run.config import load_config

SLOW_ENV = "bench.slow_env:SlowCartPole"
ALGOS = {"ppo": "cartpole-ppo.yaml", "appo": "cartpole-appo.yaml"}
GOAL_USED = 0.95
FIGURES = ("appo_solve_s", "ppo_solve_s", "appo_used_fraction", "ppo_used_fraction",
           "appo_solve_env_steps", "ppo_solve_env_steps")
SHORT = {"seeds": [0], "stop_value": 60.0, "step_ms": 0.1, "collectors": 2}


def slow_config(algo: str, work: Path, step_s: float, stop_value: float | None) -> Path:
    """The algorithm's ready config on the slow CartPole, written into `work`."""
    data = load_config(REPO_ROOT / "configs" / ALGOS[algo]).model_dump(mode="json")
    data["env"].update(id=SLOW_ENV, kwargs={"step_s": step_s})
    data["stop"]["max_wall_s"] = 300
    if stop_value is not None:
        data["eval"]["stop_value"] = stop_value
    return write_yaml(work / f"{algo}.yaml", data)


def used_fraction(run_dir: Path) -> tuple[float | None, dict]:
    """Rows learned from over env steps collected, from the run's last info record and the
    learner's last report (see the module's docstring)."""
    info: dict = {}
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            if row.get("scope") == "info":
                info = row
    summary = json.loads((run_dir / "summary.json").read_text())
    train = summary.get("train") or {}
    collected = info.get("counters/env_steps") or summary.get("env_steps")
    consumed = info.get("buffer/rollouts/consumed_items")
    if not collected or consumed is None:
        return None, {}
    stale = float(train.get("dropped_stale_rows", 0.0))
    parts = {"collected": collected, "consumed": consumed, "learner_dropped": stale,
             "coordinator_dropped": info.get("buffer/rollouts/dropped_items", 0.0),
             "policy_lag_mean": train.get("policy_lag_mean")}
    return (consumed - stale) / collected, parts


def table(rows: list[dict]) -> Table:
    t = Table(title="CartPole, 4 slow collectors: PPO against APPO (median over seeds last)")
    for col in ("algo", "seed", "solved", "solve s", "env steps to solve", "used", "lag",
                "dropped (coord / learner)"):
        t.add_column(col, justify="left" if col == "algo" else "right")
    for r in rows:
        p = r["parts"]
        t.add_row(r["algo"], str(r["seed"]), "yes" if r["solved"] else "no",
                  fmt(r["solve_s"], ".1f"), fmt(r["solve_env_steps"], ","),
                  fmt(r["used"], ".3f"), fmt(p.get("policy_lag_mean"), ".2f"),
                  f"{fmt(p.get('coordinator_dropped'), ',.0f')} / "
                  f"{fmt(p.get('learner_dropped'), ',.0f')}")
    for algo in ALGOS:
        mine = [r for r in rows if r["algo"] == algo]
        t.add_row(f"[b]{algo}[/]", "median", f"{sum(r['solved'] for r in mine)}/{len(mine)}",
                  fmt(median(r["solve_s"] for r in mine), ".1f"),
                  fmt(median(r["solve_env_steps"] for r in mine), ",.0f"),
                  fmt(median(r["used"] for r in mine), ".3f",
                      f" (goal >= {GOAL_USED})" if algo == "appo" else ""), "", "")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--collectors", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=1.0)
    parser.add_argument("--stop-value", type=float, default=None,
                        help="the evaluation return that ends a run (default: the configs')")
    args = parse_args(parser, argv, SHORT)
    work = Path(tempfile.mkdtemp(prefix="rlfleet-async-"))
    rows: list[dict] = []
    try:
        configs = {a: slow_config(a, work, args.step_ms / 1000.0, args.stop_value)
                   for a in ALGOS}
        for seed in args.seeds:
            for algo in (ALGOS if seed % 2 == 0 else reversed(list(ALGOS))):
                log(f"seed {seed}: {algo}, {args.collectors} collectors, "
                    f"{args.step_ms:g} ms a step...")
                run = run_cluster(configs[algo], seed, args.collectors,
                                  work / f"{algo}-{seed}", None)
                used, parts = used_fraction(run.run_dir)
                rows.append({"algo": algo, "seed": seed, "solved": run.solved,
                             "solve_s": run.train_s, "solve_env_steps": run.solve_env_steps,
                             "used": used, "parts": parts})
                log(f"seed {seed}: {algo} {run.outcome}, {fmt(run.train_s, '.1f', ' s')}, "
                    f"{fmt(run.solve_env_steps, ',')} env steps, used {fmt(used, '.3f')}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    def med(algo: str, key: str) -> float | None:
        return rounded(median(r[key] for r in rows if r["algo"] == algo), 3)

    report({"appo_solve_s": med("appo", "solve_s"), "ppo_solve_s": med("ppo", "solve_s"),
            "appo_used_fraction": med("appo", "used"), "ppo_used_fraction": med("ppo", "used"),
            "appo_solve_env_steps": med("appo", "solve_env_steps"),
            "ppo_solve_env_steps": med("ppo", "solve_env_steps"),
            "solved": {a: sum(r["solved"] for r in rows if r["algo"] == a) for a in ALGOS},
            "seeds": args.seeds, "collectors": args.collectors, "step_ms": args.step_ms,
            "runs": [{k: (rounded(v, 3) if isinstance(v, float) else v)
                      for k, v in r.items()} for r in rows]}, table(rows))
    return 0


if __name__ == "__main__":
    run_main(main)
