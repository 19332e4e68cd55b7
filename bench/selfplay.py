"""Self-play games per second through the cluster, beside the same games in one process.

For each game (tic-tac-toe, Connect Four), its training config (`configs/<game>-selfplay
.yaml`, its replay ratio kept; evaluations and stop rules off, so both sides only play and
learn) runs three ways, in turn:
- *in one process* (the ceiling): `rlfleet.single_process.run_single` plays the same
  games with the same battle rollout, league (PFSP draws, snapshots) and learner at the same
  replay ratio: the cluster's own roles as threads of one process (an in-process
  transport, directory storage), taking turns on one core;
- *through the cluster*: `rlfleet up` with one collector (`--collectors N`) and the learner;
  its games are the coordinator's episode count in the run's `info` records, timed by their
  wall clock over the steady part of the run;
- *playing only* (for reference): the battle rollout alone, no learner, one core: how fast
  the games themselves go.

`ratio` = cluster / one process; the goal is >= 0.7. What the cluster pays beside the games:
chunk encoding and writes, reports and their answers (which carry the next opponents),
policy refreshes and snapshot loads; what it gains: playing and learning on two cores at
once. The one-process figure includes its first seconds, before the buffer's `min_size`,
when it plays without learning (a slight bias in its favour). Each figure is measured
`--repeats` times and reported with its spread (this machine is shared and noisy).

    python -m bench.selfplay [--games tictactoe_v3 connect_four_v3] [--seconds 30]
                             [--repeats 2] [--collectors 1] [--warmup-s 12] [--short]

The last line of stdout is one JSON object: `games_per_s`, `in_process_games_per_s` and
`ratio` (each the median per game), `ratio_min` (the worse game), `play_only_games_per_s`,
and `runs` (every figure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from rich.table import Table

from bench.common import (
    REPO_ROOT,
    die_with_parent,
    fmt,
    log,
    median,
    parse_args,
    ratio,
    report,
    rounded,
    run_main,
    up_command,
    write_yaml,
)

CONFIGS = {"tictactoe_v3": "configs/tictactoe-selfplay.yaml",
           "connect_four_v3": "configs/connect4-selfplay.yaml"}
WARMUP_S = 12.0  # start-up, torch's import, the buffer's min_size: not the steady pace
FIGURES = ("games_per_s", "in_process_games_per_s", "ratio", "play_only_games_per_s",
           "ratio_min")
# Tic-tac-toe alone (each figure is one value per game), once, over seconds; the cluster's
# warm-up just past its start.
SHORT = {"games": ["tictactoe_v3"], "seconds": 3.0, "repeats": 1, "warmup_s": 6.0}


def bench_config(game: str, tmp: Path, name: str, seconds: float) -> Path:
    from rlfleet.shared.run.config import load_config

    data = load_config(REPO_ROOT / CONFIGS[game]).model_dump(mode="json")
    data["name"] = name
    data["storage"] = str(tmp / name / "storage")
    data["eval"].update(every_env_steps=10**12, stop_value=None)
    data["league"]["stop_when"] = []
    data["stop"] = {"max_env_steps": None, "max_wall_s": seconds}
    data["logging"]["scopes"]["info"]["every_env_steps"] = 500
    return write_yaml(tmp / f"{name}.yaml", data)


def single_process(config: Path) -> float:
    """Games per second of one process playing and learning (`rlfleet single`)."""
    from rlfleet.shared.run.config import load_config
    from rlfleet.single_process import run_single

    result = run_single(load_config(config))
    assert result.games is not None
    return result.games / result.wall_seconds


def play_only(config: Path, seconds: float) -> float:
    """Games per second of one process playing the config's tables, learning nothing."""
    import numpy as np
    import torch

    from rlfleet.shared.algos.registry import make_policy
    from rlfleet.shared.envs.make import run_spec
    from rlfleet.shared.infra.storage import DirectoryStorage
    from rlfleet.shared.league.league import League
    from rlfleet.shared.league.matchmaking import as_opponent
    from rlfleet.shared.rollout.battle import BattleRollout, OpponentPool
    from rlfleet.shared.run.config import load_config

    torch.set_num_threads(1)
    cfg = load_config(config)
    assert cfg.league is not None
    spec = run_spec(cfg)
    policy = make_policy(cfg.algo, spec, cfg.seed)
    policy.load_policy(0, policy.policy_state())
    league = League(cfg.league)
    rng = np.random.default_rng(cfg.seed)
    with tempfile.TemporaryDirectory() as tmp:
        pool = OpponentPool(cfg, spec, DirectoryStorage(tmp), cfg.seed)
        rollout = BattleRollout(cfg, policy, pool,
                                lambda: as_opponent(league.pick_opponent(rng)),
                                cfg.collector.chunk_size, cfg.collector.mode,
                                cfg.collector.episodes_per_chunk, cfg.seed)
        deadline = time.perf_counter() + 2.0
        while time.perf_counter() < deadline:  # warm up
            rollout.collect(10**9)
        games0, t0 = rollout.games_played, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            chunk = rollout.collect(10**9)
            for g in chunk.games:
                league.record_game("main", g.opponent, g.outcome)
        return (rollout.games_played - games0) / (time.perf_counter() - t0)


def through_cluster(config: Path, run_dir: Path, seconds: float, collectors: int,
                    warmup_s: float = WARMUP_S) -> float:
    """Games per second the coordinator accepted over the steady part of a run."""
    wall = warmup_s + seconds
    # --max-wall-s: the config's own limit is the one-process run's
    cmd = up_command(config, run_dir, collectors, "--max-wall-s", str(wall))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,
                          preexec_fn=die_with_parent,
                          timeout=wall + 120)
    if proc.returncode not in (0, 3):  # 3: stopped by its budget, not solved
        raise RuntimeError(f"rlfleet up failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    points = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        with_json = json.loads(line)
        if with_json.get("scope") == "info" and "counters/episodes" in with_json:
            points.append((with_json["wall_time"], with_json["counters/episodes"]))
    if len(points) < 3:
        raise RuntimeError(f"too few info records in {run_dir} to time the games")
    t_end, g_end = points[-1]
    steady = [p for p in points if p[0] >= t_end - seconds] or points[-2:]
    t0, g0 = steady[0]
    if t_end <= t0:
        t0, g0 = points[-2]
    return (g_end - g0) / (t_end - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--games", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per run")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--collectors", type=int, default=1)
    ap.add_argument("--warmup-s", type=float, default=WARMUP_S,
                    help="seconds of a cluster run before its measured part")
    args = parse_args(ap, argv, SHORT)

    runs: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="rlfleet-selfplay-") as tmp_s:
        tmp = Path(tmp_s)
        for game in args.games:
            runs[game] = {"in_process": [], "cluster": [], "play_only": []}
            for r in range(args.repeats):
                name = f"selfplay-{game}-{r}"
                config = bench_config(game, tmp, name, args.seconds)
                log(f"{game} run {r + 1}/{args.repeats}: one process...")
                runs[game]["in_process"].append(single_process(config))
                log(f"{game} run {r + 1}/{args.repeats}: rlfleet up...")
                runs[game]["cluster"].append(
                    through_cluster(config, tmp / name, args.seconds, args.collectors,
                                    args.warmup_s))
                log(f"{game} run {r + 1}/{args.repeats}: playing only...")
                runs[game]["play_only"].append(play_only(config, min(args.seconds, 10.0)))
                log(f"  one process {runs[game]['in_process'][-1]:.0f}, cluster "
                    f"{runs[game]['cluster'][-1]:.0f}, playing only "
                    f"{runs[game]['play_only'][-1]:.0f} games/s")

    table = Table(title="self-play games per second (playing and learning)", caption=(
        f"cluster: rlfleet up, {args.collectors} collector(s) and the learner; one process: "
        "the same games, league and learning at the config's replay ratio (rlfleet single); "
        "playing only: no learner"))
    for col in ("game", "one process (ceiling)", "cluster", "ratio", "playing only",
                "runs (one process / cluster)"):
        table.add_column(col)
    out: dict = {"games_per_s": {}, "in_process_games_per_s": {}, "ratio": {},
                 "play_only_games_per_s": {}}
    for game, figs in runs.items():
        ceiling, cluster = median(figs["in_process"]), median(figs["cluster"])
        r = ratio(cluster, ceiling)
        out["games_per_s"][game] = rounded(cluster, 1)
        out["in_process_games_per_s"][game] = rounded(ceiling, 1)
        out["ratio"][game] = rounded(r, 3)
        out["play_only_games_per_s"][game] = rounded(median(figs["play_only"]), 1)
        table.add_row(game, fmt(ceiling), fmt(cluster), fmt(r, ".3f"),
                      fmt(median(figs["play_only"])), ", ".join(
                          f"{a:.0f}/{b:.0f}" for a, b in zip(figs["in_process"],
                                                             figs["cluster"], strict=True)))
    ratios = [v for v in out["ratio"].values() if v is not None]
    out["ratio_min"] = min(ratios) if ratios else None
    out["goal"] = {"ratio": 0.7}
    out["runs"] = runs
    report(out, table)
    return 0


if __name__ == "__main__":
    run_main(main)
