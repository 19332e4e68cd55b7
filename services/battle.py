"""`rlfleet battle RUN_DIR`: a self-play run's trained policy against the league's bots (and
its first snapshot, when the run's storage still holds it), N games from each seat, as a
table and one JSON line.

An evaluation that does not trust the run's own: fresh seeds, as many games as asked, on
the weights the run kept as its result (`best_policy.safetensors`: the policy that met the
stop rules, else the best-scoring one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.run.config import load_config


def battle_run(run_dir: Path, games: int, seed: int, policy_path: Path | None = None
               ) -> dict[str, Any]:
    import torch

    from rlfleet.coordinator.evaluation import battle_rates
    from rlfleet.shared.algos.registry import make_policy
    from rlfleet.shared.contract.codec import decode_weights
    from rlfleet.shared.contract.wire.evaluation import BattleOutcome
    from rlfleet.shared.contract.wire.tasks import Opponent
    from rlfleet.shared.envs.make import run_spec
    from rlfleet.shared.infra.storage import open_storage, snapshot_blob
    from rlfleet.shared.rollout.battle import OpponentPool, battle_evaluate

    torch.set_num_threads(1)
    cfg = load_config(run_dir / "config.yaml")
    if cfg.league is None:
        raise ConfigError(f"{run_dir}: not a self-play run (its config has no league:)")
    path = policy_path or run_dir / "best_policy.safetensors"
    if not path.is_file():
        raise ConfigError(f"{path}: no trained policy to evaluate")
    spec = run_spec(cfg)
    state, meta = decode_weights(path.read_bytes())
    version = int(meta.get("policy_version", "0"))
    policy = make_policy(cfg.algo, spec, seed)
    policy.load_policy(version, state)
    storage = open_storage(cfg.storage or str(run_dir / "storage"), cfg.name)
    try:
        opponents = [Opponent(name=f"bot-{b}", kind="bot", bot=b) for b in cfg.league.bots]
        league = _league(run_dir)
        first = league.get("first_snapshot") if league else None
        if first:
            v = int(first.removeprefix("snapshot-"))
            if storage.get_blob(snapshot_blob(v)) is not None:
                opponents.append(Opponent(name=first, kind="snapshot", policy_version=v))
        pool = OpponentPool(cfg, spec, storage, seed)
        tallies = battle_evaluate(cfg, policy, pool, opponents, games, seed, tables=32)
    finally:
        storage.close()
    rates = battle_rates([BattleOutcome(opponent=t.opponent, first=t.first, win=t.win,
                                        draw=t.draw, loss=t.loss) for t in tallies])
    return {"policy": str(path), "policy_version": version, "games_per_seat": games,
            "seed": seed, "rates": rates,
            "counts": [{"opponent": t.opponent, "first": t.first, "win": t.win,
                        "draw": t.draw, "loss": t.loss} for t in tallies]}


def _league(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / "league.json").read_text())
    except (OSError, ValueError):
        return None


def print_battle(result: dict[str, Any]) -> None:
    table = Table(title=f"policy version {result['policy_version']}: "
                  f"{result['games_per_seat']} games per seat")
    for col in ("opponent", "seat", "win", "draw", "loss"):
        table.add_column(col)
    for c in result["counts"]:
        table.add_row(c["opponent"], "first" if c["first"] else "second", str(c["win"]),
                      str(c["draw"]), str(c["loss"]))
    Console(highlight=False).print(table)
    print(json.dumps(result), flush=True)
