"""Time to solve CartPole: the cluster (`rlfleet up`) beside the single-process runner.

For each seed, the whole cluster runs as local processes (`rlfleet up`, a subprocess) until
the coordinator's evaluation reaches the config's stop value (475), then the single-process
runner (`rlfleet.single_process.run_single`: the cluster's own coordinator, collector and
learner as threads of this process, talking through an in-process transport and directory
storage, taking turns on one core) trains the same config with the same seed in this
process, stepping as many envs as the cluster's collectors together (`env.num_envs` x
collectors; see `single_config`). Their ratio is the cost of distribution on this machine,
measured in the same run.

    python -m bench.time_to_solve --algo dqn|ppo [--seeds 0 1 2] [--collectors 2]
                                  [--storage DIR_OR_REDIS_URL] [--n-step N]
                                  [--stop-value R] [--short]

`--n-step N` (DQN) runs every seed twice on each side, with 1-step and with N-step returns
(`algo.n_step`), and reports the env steps each needed to solve beside each other:
`env_steps_n1` and `env_steps_nN` are the medians over solved seeds of the cluster's env
steps at its solving evaluation (`single_env_steps_n1`/`_nN` the single process's), with
per-seed lists (null: not solved) and each variant's full summary under `n1` and `nN`.

Cluster times: `run_seconds` is the coordinator's clock from its start to the solving
evaluation (the single process's time is the same clock: its coordinator runs in it);
`train` starts at the first chunk the coordinator accepted (workers' start-up, 2-6 s of
importing torch on this machine, left out: it dominates PPO's few-second solves);
`wall_seconds` is the launcher's, process start-up and shutdown included. The time to 195
comes from the coordinator's evaluation history (`<run-dir>/evaluations.json`).
`first_chunk_s` is the time to the first chunk accepted, from the launch of `rlfleet up` when
the run's summary has it (`first_chunk_s_from_launch`), else from the coordinator's start
(`first_chunk_from` says which).

Learning per env step: `env_steps_ratio` compares the env steps each side had collected when
its solving evaluation was reported (on both sides the collectors run on while an evaluation
is made). Beside it, per seed, what explains a difference: updates per env step, the
learner's lead over the replay ratio's line (trained items minus samples_per_insert x
(inserted - min_size), in batches, averaged over the coordinator's info records) and the
policy lag of the chunks (learner version minus acting version, as the coordinator sees
them).
The last line of stdout is one JSON object (see `summarise`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from bench.common import (
    REPO_ROOT,
    clear_storage,
    fmt,
    is_redis,
    log,
    median,
    parse_args,
    ratio,
    report,
    rounded,
    run_main,
    run_up,
    write_yaml,
)

CONFIGS = {"dqn": REPO_ROOT / "configs" / "cartpole-dqn.yaml",
           "ppo": REPO_ROOT / "configs" / "cartpole-ppo.yaml"}
EASY_TARGET = 195.0  # CartPole-v0's threshold: an earlier, noisier milestone
FIGURES = ("cluster_solve_s", "single_process_solve_s", "ratio", "cluster_train_s",
           "ratio_train", "cluster_solve_195_s", "single_solve_195_s", "ratio_195",
           "cluster_env_steps", "single_env_steps", "cluster_wall_s", "cluster_solve_env_steps",
           "single_solve_env_steps", "env_steps_ratio", "first_chunk_s",
           "cluster_updates_per_env_step", "single_updates_per_env_step",
           "cluster_lead_batches", "cluster_policy_lag")
# One seed, one collector, and solved at 195 (so the time to 195 is the same evaluation's):
# DQN gets there in a few thousand env steps, where 475 takes tens of thousands; info records
# every 500 env steps, so that such a short run has some to read its learner's lead from.
SHORT = {"seeds": [0], "collectors": 1, "stop_value": EASY_TARGET, "info_every": 500}


@dataclass
class ClusterResult:
    seed: int
    solved: bool
    outcome: str
    run_s: float | None    # coordinator start -> solving evaluation
    train_s: float | None  # first chunk accepted -> solving evaluation (start-up excluded)
    wall_s: float | None   # launcher start -> cluster stopped (start-up included)
    t195_s: float | None   # coordinator start -> first evaluation >= 195
    env_steps: int | None
    train_iterations: int | None
    evaluations: int
    run_dir: Path
    solve_env_steps: int | None = None         # at the solving evaluation's report
    solve_train_iterations: int | None = None
    first_chunk_s: float | None = None          # see first_chunk_from
    first_chunk_from: str | None = None         # "launch" or "coordinator start"
    lead_batches: float | None = None           # learner's mean lead over the ratio's line
    policy_lag: float | None = None             # mean versions between learner and actor

    @property
    def updates_per_env_step(self) -> float | None:
        return ratio(self.solve_train_iterations, self.solve_env_steps)


@dataclass
class SingleResult:
    seed: int
    solved: bool
    solve_s: float | None
    t195_s: float | None
    env_steps: int
    train_iterations: int

    @property
    def updates_per_env_step(self) -> float | None:
        return ratio(self.train_iterations, self.env_steps)


def first_reaching(evaluations: list[dict], target: float) -> dict | None:
    return next((e for e in evaluations if e["return_mean"] >= target), None)


def learning_diagnostics(run_dir: Path, config: Path) -> tuple[float | None, float | None]:
    """(the learner's mean lead over the ratio's line in batches, the mean policy lag of
    the chunks), from the run's metrics.jsonl (None where it has no such records)."""
    from rlfleet.shared.run.config import load_config

    cfg = load_config(config)
    buffer = cfg.learner.mix[0].buffer
    limit = cfg.buffers[buffer].rate_limit
    batch = cfg.algo.batch_size
    leads, lags = [], []
    path = run_dir / "metrics.jsonl"
    if not path.exists() or limit.samples_per_insert is None:
        return None, None
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("scope") == "collect" and "collect/policy_lag" in rec:
            lags.append(rec["collect/policy_lag"])
        inserted = rec.get(f"buffer/{buffer}/inserted_items")
        trained = rec.get("counters/train_iterations")
        if rec.get("scope") != "info" or inserted is None or trained is None \
                or inserted < limit.min_size or trained <= 0:
            continue
        line_items = (inserted - limit.min_size) * limit.samples_per_insert
        leads.append((trained * batch - line_items) / batch)
    return median(leads), median(lags)


def run_cluster(config: Path, seed: int, collectors: int, run_dir: Path,
                storage: str | None) -> ClusterResult:
    options = ["--seed", str(seed)]
    if storage:
        options += ["--storage", storage]
        if is_redis(storage):  # the run's namespace is its directory's name: start empty
            clear_storage(storage, run_dir.name[:64])
    up = run_up(run_dir, config, collectors, f"seed {seed}", *options)
    if up.summary is None:
        return ClusterResult(seed, False, up.outcome, None, None, None, None, None, None, 0,
                             run_dir)
    summary, evals_path = up.summary, run_dir / "evaluations.json"
    evaluations = json.loads(evals_path.read_text()) if evals_path.exists() else []
    if not evals_path.exists():
        log(f"[yellow]seed {seed}: no evaluations.json: time to {EASY_TARGET:.0f} unknown[/]")
    easy = first_reaching(evaluations, EASY_TARGET)
    solved = bool(summary["solved"])
    solving = (first_reaching(evaluations, summary["stop_value"])
               if solved and summary.get("stop_value") is not None else None)
    if summary.get("first_chunk_s_from_launch") is not None:
        first_chunk, first_from = summary["first_chunk_s_from_launch"], "launch"
    else:
        first_chunk, first_from = summary.get("first_chunk_seconds"), "coordinator start"
    lead, lag = learning_diagnostics(run_dir, config)
    return ClusterResult(
        seed=seed, solved=solved, outcome=summary["outcome"],
        run_s=summary["run_seconds"] if solved else None,
        train_s=(summary["run_seconds"] - summary["first_chunk_seconds"]
                 if solved and summary.get("first_chunk_seconds") is not None else None),
        wall_s=summary["wall_seconds"] if solved else None,
        t195_s=easy["wall_time"] if easy else None,
        env_steps=summary["env_steps"], train_iterations=summary["train_iterations"],
        evaluations=len(evaluations), run_dir=run_dir,
        solve_env_steps=solving["env_steps"] if solving else None,
        solve_train_iterations=solving["train_iterations"] if solving else None,
        first_chunk_s=first_chunk, first_chunk_from=first_from if first_chunk is not None
        else None, lead_batches=lead, policy_lag=lag)


def single_config(config: Path, seed: int, collectors: int):
    """The config the single process runs: the cluster's, with as many envs as all of the
    cluster's collectors step together (`env.num_envs` is per collector). How many envs
    step side by side changes how much a DQN learns per env step (on CartPole, 8 envs in one
    process needed 55k-72k env steps where 4 needed 12k-65k), so the two sides compare
    like with like."""
    from rlfleet.shared.run.config import load_config, parse_config

    cfg = load_config(config)
    data = cfg.model_dump()
    data["seed"] = seed
    data["env"]["num_envs"] = cfg.env.num_envs * collectors
    return parse_config(data, f"{config} for the single process")


def run_single_process(config: Path, seed: int, collectors: int) -> SingleResult:
    from rlfleet.single_process import run_single

    res = run_single(single_config(config, seed, collectors))
    return SingleResult(seed=seed, solved=res.solved,
                        solve_s=res.solved_s if res.solved else None,
                        t195_s=res.solved_195_s,
                        env_steps=res.solved_env_steps if res.solved else res.env_steps,
                        train_iterations=res.train_iterations)


def table(clusters: list[ClusterResult], singles: list[SingleResult], med: dict,
          stop_value: float | None) -> Table:
    t = Table(title=f"time to solve (eval return >= {stop_value:g}): cluster vs single process",
              caption="cluster t: coordinator start -> solving evaluation; train: first chunk "
                      "-> solving evaluation (workers' start-up excluded); wall: launcher, "
                      "process start-up included; '-' = not reached within the run's limits",
              show_lines=False)
    for name in ("seed", f"cluster t→{stop_value:g}", "cluster train", "cluster wall",
                 f"single t→{stop_value:g}",
                 "ratio", "ratio train",
                 "cluster t→195", "single t→195", "ratio 195", "cluster env steps",
                 "single env steps", "steps ratio", "first chunk", "cluster outcome"):
        t.add_column(name, justify="right" if name != "cluster outcome" else "left")
    for c, s in zip(clusters, singles, strict=True):
        t.add_row(str(c.seed), fmt(c.run_s, ".1f", " s"), fmt(c.train_s, ".1f", " s"),
                  fmt(c.wall_s, ".1f", " s"),
                  fmt(s.solve_s, ".1f", " s"), fmt(ratio(c.run_s, s.solve_s), ".2f", "x"),
                  fmt(ratio(c.train_s, s.solve_s), ".2f", "x"),
                  fmt(c.t195_s, ".1f", " s"), fmt(s.t195_s, ".1f", " s"),
                  fmt(ratio(c.t195_s, s.t195_s), ".2f", "x"),
                  fmt(c.solve_env_steps, ","), fmt(s.env_steps if s.solved else None, ","),
                  fmt(ratio(c.solve_env_steps, s.env_steps if s.solved else None), ".2f", "x"),
                  fmt(c.first_chunk_s, ".1f", " s"), c.outcome)
    t.add_section()
    t.add_row("median", fmt(med["cluster_solve_s"], ".1f", " s"),
              fmt(med["cluster_train_s"], ".1f", " s"), fmt(med["cluster_wall_s"], ".1f", " s"),
              fmt(med["single_process_solve_s"], ".1f", " s"), fmt(med["ratio"], ".2f", "x"),
              fmt(med["ratio_train"], ".2f", "x"),
              fmt(med["cluster_solve_195_s"], ".1f", " s"),
              fmt(med["single_solve_195_s"], ".1f", " s"), fmt(med["ratio_195"], ".2f", "x"),
              fmt(med["cluster_solve_env_steps"], ",.0f"),
              fmt(med["single_solve_env_steps"], ",.0f"), fmt(med["env_steps_ratio"], ".2f", "x"),
              fmt(med["first_chunk_s"], ".1f", " s"),
              f"{len(med['solved_seeds'])}/{len(clusters)} solved", style="bold")
    return t


def learning_table(clusters: list[ClusterResult], singles: list[SingleResult]) -> Table:
    t = Table(title="learning per env step: what the cluster's policies had behind them",
              caption="lead: the learner's trained items over samples_per_insert x (inserted - "
                      "min_size), in batches; lag: learner version - acting version of each "
                      "chunk")
    for name in ("seed", "cluster updates/step", "single updates/step", "cluster lead",
                 "cluster policy lag"):
        t.add_column(name, justify="right")
    for c, s in zip(clusters, singles, strict=True):
        t.add_row(str(c.seed), fmt(c.updates_per_env_step, ".3f"),
                  fmt(s.updates_per_env_step, ".3f"), fmt(c.lead_batches, ".0f"),
                  fmt(c.policy_lag, ".1f"))
    return t


def summarise(algo: str, collectors: int, clusters: list[ClusterResult],
              singles: list[SingleResult]) -> dict:
    """Medians over seeds; a time is left out of its median when that seed did not reach the
    target (so `solved_seeds` must be read beside them)."""
    cluster_s = median(c.run_s for c in clusters)
    train_s = median(c.train_s for c in clusters)
    single_s = median(s.solve_s for s in singles)
    cluster_195 = median(c.t195_s for c in clusters)
    single_195 = median(s.t195_s for s in singles)
    cluster_steps = median(c.solve_env_steps for c in clusters)
    single_steps = median(s.env_steps for s in singles if s.solved)
    froms = {c.first_chunk_from for c in clusters if c.first_chunk_from}
    return {
        "cluster_solve_s": rounded(cluster_s),
        "single_process_solve_s": rounded(single_s),
        "ratio": rounded(ratio(cluster_s, single_s)),
        "cluster_train_s": rounded(train_s),
        "ratio_train": rounded(ratio(train_s, single_s)),
        "cluster_solve_195_s": rounded(cluster_195),
        "solved_seeds": [c.seed for c in clusters if c.solved],
        "single_solve_195_s": rounded(single_195),
        "cluster_env_steps": rounded(median(c.env_steps for c in clusters), 0),
        "single_env_steps": rounded(median(s.env_steps for s in singles), 0),
        "cluster_wall_s": rounded(median(c.wall_s for c in clusters)),
        "ratio_195": rounded(ratio(cluster_195, single_195)),
        "cluster_solve_env_steps": rounded(cluster_steps, 0),
        "single_solve_env_steps": rounded(single_steps, 0),
        "env_steps_ratio": rounded(ratio(cluster_steps, single_steps)),
        "first_chunk_s": rounded(median(c.first_chunk_s for c in clusters)),
        "first_chunk_from": " / ".join(sorted(froms)) or None,
        "cluster_updates_per_env_step": rounded(median(c.updates_per_env_step
                                                       for c in clusters), 4),
        "single_updates_per_env_step": rounded(median(s.updates_per_env_step
                                                      for s in singles), 4),
        "cluster_lead_batches": rounded(median(c.lead_batches for c in clusters), 1),
        "cluster_policy_lag": rounded(median(c.policy_lag for c in clusters), 2),
        "single_solved_seeds": [s.seed for s in singles if s.solved],
        "algo": algo,
        "collectors": collectors,
        "seeds": [c.seed for c in clusters],
        "per_seed": [{"seed": c.seed, "cluster_solve_s": rounded(c.run_s),
                      "cluster_train_s": rounded(c.train_s),
                      "cluster_wall_s": rounded(c.wall_s),
                      "cluster_solve_195_s": rounded(c.t195_s), "cluster_env_steps": c.env_steps,
                      "cluster_solve_env_steps": c.solve_env_steps,
                      "cluster_first_chunk_s": rounded(c.first_chunk_s),
                      "cluster_updates_per_env_step": rounded(c.updates_per_env_step, 4),
                      "cluster_lead_batches": rounded(c.lead_batches, 1),
                      "cluster_policy_lag": rounded(c.policy_lag, 2),
                      "single_process_solve_s": rounded(s.solve_s),
                      "single_solve_195_s": rounded(s.t195_s),
                      "single_env_steps": s.env_steps}
                     for c, s in zip(clusters, singles, strict=True)],
    }


def adjusted_config(config: Path, work: Path, stop_value: float | None = None,
                    info_every: int | None = None) -> Path:
    """`config` with `eval.stop_value` and the run's info records' interval (env steps) set
    where given, written beside the run dirs. A run that solves within the config's interval
    (5,000 env steps) leaves no info record once training has begun, and the learner's lead
    is read from those."""

    from rlfleet.shared.run.config import load_config

    data = load_config(config).model_dump(mode="json")
    if stop_value is not None:
        data["eval"]["stop_value"] = stop_value
    if info_every is not None:
        data["logging"]["scopes"]["info"]["every_env_steps"] = info_every
    return write_yaml(work / f"{config.stem}-adjusted.yaml", data)


def n_step_config(config: Path, n_step: int, work: Path) -> Path:
    """`config` with `algo.n_step` set, written beside the run dirs."""
    import yaml

    data = yaml.safe_load(config.read_text())
    data.setdefault("algo", {})["n_step"] = n_step
    return write_yaml(work / f"{config.stem}-n{n_step}.yaml", data)


def run_seeds(config: Path, seeds: list[int], collectors: int, storage_arg: str | None,
              work: Path, stamp: str, stop_value: float | None, tag: str = ""
              ) -> tuple[list[ClusterResult], list[SingleResult]]:
    """Cluster then single process, per seed (slow drift hits both alike)."""
    clusters: list[ClusterResult] = []
    singles: list[SingleResult] = []
    for seed in seeds:
        storage = storage_arg
        if storage and not is_redis(storage):  # one fresh directory per run
            storage = str(Path(storage).resolve() / f"cluster{tag}-{seed}-{stamp}")
        log(f"seed {seed}{tag}: cluster ({collectors} collectors)...")
        c = run_cluster(config, seed, collectors, work / f"cluster{tag}-{seed}", storage)
        clusters.append(c)
        if storage:  # a user-given storage is left as it was found
            clear_storage(storage, c.run_dir.name[:64])
        log(f"seed {seed}{tag}: cluster {c.outcome}: t→{stop_value:g} "
            f"{fmt(c.run_s, '.1f', ' s')} (wall {fmt(c.wall_s, '.1f', ' s')}), t→195 "
            f"{fmt(c.t195_s, '.1f', ' s')}, {fmt(c.env_steps, ',')} env steps "
            f"(solving evaluation at {fmt(c.solve_env_steps, ',')})")
        log(f"seed {seed}{tag}: single process ({collectors} x env.num_envs envs)...")
        s = run_single_process(config, seed, collectors)
        singles.append(s)
        log(f"seed {seed}{tag}: single {'solved' if s.solved else 'not solved'}: "
            f"t→{stop_value:g} {fmt(s.solve_s, '.1f', ' s')}, t→195 {fmt(s.t195_s, '.1f', ' s')}"
            f", {s.env_steps:,} env steps")
    return clusters, singles


def n_step_summary(n_step: int, variants: dict[int, tuple[list[ClusterResult],
                                                         list[SingleResult]]]) -> dict:
    """Env steps to solve per n (medians over solved seeds, and per seed)."""
    out: dict = {"n_step": n_step}
    for n, (clusters, _) in variants.items():
        out[f"env_steps_n{n}"] = rounded(median(c.solve_env_steps for c in clusters), 0)
    for n, (_, singles) in variants.items():
        out[f"single_env_steps_n{n}"] = rounded(median(s.env_steps for s in singles
                                                       if s.solved), 0)
    for n, (clusters, singles) in variants.items():
        out[f"env_steps_n{n}_per_seed"] = [c.solve_env_steps for c in clusters]
        out[f"single_env_steps_n{n}_per_seed"] = [s.env_steps if s.solved else None
                                                  for s in singles]
        out[f"solved_seeds_n{n}"] = [c.seed for c in clusters if c.solved]
        out[f"single_solved_seeds_n{n}"] = [s.seed for s in singles if s.solved]
    out["env_steps_ratio_n"] = rounded(ratio(out[f"env_steps_n{n_step}"], out["env_steps_n1"]))
    out["single_env_steps_ratio_n"] = rounded(ratio(out[f"single_env_steps_n{n_step}"],
                                                    out["single_env_steps_n1"]))
    out["seeds"] = [c.seed for c in variants[1][0]]
    return out


def n_step_table(n_step: int, result: dict) -> Table:
    t = Table(title=f"env steps to solve: 1-step beside {n_step}-step DQN",
              caption="at the solving evaluation; '-' = not solved within the run's limits")
    for name in ("seed", "cluster n=1", f"cluster n={n_step}", "single n=1",
                 f"single n={n_step}"):
        t.add_column(name, justify="right")
    rows = zip(result["seeds"], result["env_steps_n1_per_seed"],
               result[f"env_steps_n{n_step}_per_seed"], result["single_env_steps_n1_per_seed"],
               result[f"single_env_steps_n{n_step}_per_seed"], strict=True)
    for seed, c1, cn, s1, sn in rows:
        t.add_row(str(seed), fmt(c1, ","), fmt(cn, ","), fmt(s1, ","), fmt(sn, ","))
    t.add_section()
    t.add_row("median", fmt(result["env_steps_n1"], ",.0f"),
              fmt(result[f"env_steps_n{n_step}"], ",.0f"),
              fmt(result["single_env_steps_n1"], ",.0f"),
              fmt(result[f"single_env_steps_n{n_step}"], ",.0f"), style="bold")
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algo", choices=sorted(CONFIGS), default="dqn")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--collectors", type=int, default=2)
    p.add_argument("--storage", default=None,
                   help="directory or redis://host:port/db (default: each run's own dir)")
    p.add_argument("--config", type=Path, default=None,
                   help="override the algo's config (default: configs/cartpole-<algo>.yaml)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where run dirs go (default: a fresh temporary directory, kept)")
    p.add_argument("--n-step", type=int, default=None,
                   help="DQN: run 1-step and this n-step (algo.n_step) side by side")
    p.add_argument("--stop-value", type=float, default=None,
                   help="the evaluation return that counts as solved (default: the config's)")
    p.add_argument("--info-every", type=int, default=None,
                   help="env steps between the run's info records (default: the config's)")
    args = parse_args(p, argv, SHORT)
    if args.n_step is not None and (args.algo != "dqn" or args.n_step < 2):
        p.error("--n-step N compares N >= 2 with 1-step DQN (--algo dqn)")

    from rlfleet.shared.run.config import load_config

    config = (args.config or CONFIGS[args.algo]).resolve()
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="rlfleet-tts-"))).resolve()
    if args.stop_value is not None or args.info_every is not None:
        work.mkdir(parents=True, exist_ok=True)
        config = adjusted_config(config, work, args.stop_value, args.info_every)
    stop_value = load_config(config).eval.stop_value
    stamp = time.strftime("%H%M%S")
    log(f"config {config.relative_to(REPO_ROOT) if config.is_relative_to(REPO_ROOT) else config}"
        f", seeds {args.seeds}, {args.collectors} collectors, run dirs under {work}")

    if args.n_step is not None:
        configs = {n: n_step_config(config, n, work) for n in (1, args.n_step)}
        variants: dict[int, tuple[list[ClusterResult], list[SingleResult]]] = {
            n: ([], []) for n in configs}
        for seed in args.seeds:  # per seed, 1-step then n-step: slow drift hits both alike
            for n, path in configs.items():
                c, s = run_seeds(path, [seed], args.collectors, args.storage, work, stamp,
                                 stop_value, tag=f"-n{n}")
                variants[n][0].extend(c)
                variants[n][1].extend(s)
        result = n_step_summary(args.n_step, variants)
        for n, (clusters, singles) in variants.items():
            result[f"n{n}"] = summarise(args.algo, args.collectors, clusters, singles)
        report(result, *(table(c, s, result[f"n{n}"], stop_value)
                         for n, (c, s) in variants.items()), n_step_table(args.n_step, result))
        return 0

    clusters, singles = run_seeds(config, args.seeds, args.collectors, args.storage, work,
                                  stamp, stop_value)
    result = summarise(args.algo, args.collectors, clusters, singles)
    report(result, table(clusters, singles, result, stop_value),
           learning_table(clusters, singles))
    return 0


if __name__ == "__main__":
    run_main(main)
