"""The coordinator's side of self-play: who plays whom, what the games say, and when the main
player's past joins the league.

`League` (`league.py`) is the arithmetic; this module connects it to the run:
- *assignment*: each collect task, and each answer to a chunk report, carries opponents
  drawn by PFSP, one per game reported, so the mix follows the league game by game;
- *results*: the games in chunk metadata are recorded when the chunks are accepted, which
  the journal replays after a crash, so a restored league has every acknowledged game;
- *snapshots*: when one is due, the newest published weights are copied to a blob of their
  own (published versions are pruned within seconds) and the snapshot is journalled as an
  event, then added; snapshots pushed out of the league have their blob deleted;
- *evaluation*: the opponents an evaluation plays (every bot and the newest snapshots) and
  the stop rules on its win rates;
- *what people see*: `view()` for `/api/v1/league`, and `league.json` in the run directory.

The copy is storage I/O, which can hang for a retry window during an outage: it runs on a
thread of its own, never on the scheduler's or a request's.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.shared.contract.config import LeagueConfig
from rlfleet.shared.contract.wire.evaluation import EvaluationResult
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.tasks import Opponent
from rlfleet.shared.infra.storage import Storage, StorageError, snapshot_blob
from rlfleet.shared.league.league import MAIN, League, Player
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")

MAX_OPPONENTS_PER_ANSWER = 256
VIEW_WRITE_INTERVAL_S = 5.0


def as_opponent(player: Player) -> Opponent:
    if player.kind == "snapshot":
        return Opponent(name=player.name, kind="snapshot", policy_version=player.policy_version)
    if player.kind == "bot":
        return Opponent(name=player.name, kind="bot", bot=player.name.removeprefix("bot-"))
    return Opponent(name=MAIN, kind="main")


Journal = Callable[[dict[str, Any], Callable[[], object]], None]


def solved_by(settings: LeagueConfig, battles: dict[str, dict[str, float]],
              first_snapshot: str | None) -> str | None:
    """Why an evaluation's rates (`battle_rates`) solve the run, or None: every `stop_when`
    rule met ('snapshot-first' is the league's first snapshot, `first_snapshot`)."""
    rules = settings.stop_when
    if not rules or not battles:
        return None
    said = []
    for rule in rules:
        opponent = rule.opponent
        if opponent == "snapshot-first":
            if first_snapshot is None:
                return None
            opponent = first_snapshot
        key = opponent if rule.seat == "all" else f"{opponent}/{rule.seat}"
        rates = battles.get(key)
        if rates is None or not rates.get("games"):
            return None
        if rule.min_win is not None:
            if rates["win"] < rule.min_win:
                return None
            said.append(f"{key} win {rates['win']:.3f} >= {rule.min_win}")
        if rule.max_loss is not None:
            if rates["loss"] > rule.max_loss:
                return None
            said.append(f"{key} loss {rates['loss']:.3f} <= {rule.max_loss}")
    return "solved: " + ", ".join(said)


def eval_opponents(league: League) -> list[Opponent]:
    """Whom an evaluation plays: every bot, the first snapshot (how far the main player has
    come), then the newest `eval_snapshots` snapshots."""
    players = [p for p in league.players.copy().values() if p.kind == "bot"]
    snapshots = league.snapshots()
    if snapshots:
        players.append(snapshots[0])
    n = league.settings.eval_snapshots
    if n:
        players += [p for p in snapshots[-n:] if p is not snapshots[0]]
    return [as_opponent(p) for p in players]


class Matchmaker:
    """A league change goes through the coordinator's journal (a `Journal`, handed to
    `maybe_snapshot`): `journal(event, change)` writes the event, then makes the change
    (`change()`) before any snapshot of the run can be copied, raising `StorageError` (and
    changing nothing) if the journal cannot be written. The coordinator's restore replays
    such events through `apply`."""

    def __init__(self, cfg: RunConfig, storage: Storage, run_dir: Path | None) -> None:
        assert cfg.league is not None
        self.settings = cfg.league
        self.storage = storage
        self.run_dir = run_dir
        self.league = League(cfg.league)
        self._rng = np.random.default_rng(cfg.seed * 7 + 11)
        self._rng_lock = threading.Lock()
        self._snapshotting = threading.Lock()  # one copy at a time
        self._written_at = 0.0
        self.snapshot_failures = 0

    # -- assignment -------------------------------------------------------------------------

    def opponents(self, n: int) -> list[Opponent]:
        """Opponents of the main player's next `n` games, drawn by PFSP."""
        n = max(1, min(n, MAX_OPPONENTS_PER_ANSWER))
        with self._rng_lock:
            return [as_opponent(self.league.pick_opponent(self._rng)) for _ in range(n)]

    # -- results ----------------------------------------------------------------------------

    def on_chunks(self, metas: list[ChunkMeta]) -> None:
        """Accepted chunks' games and skipped opponents (under the coordinator's lock; the
        journal replay calls it too)."""
        for meta in metas:
            for game in meta.games:
                self.league.record_game(MAIN, game.opponent, game.outcome)
            for name in meta.opponents_skipped:
                if self.league.drop(name):
                    log.warning("league: %s dropped, a collector could not load it", name)

    @staticmethod
    def games_in(metas: list[ChunkMeta]) -> int:
        return sum(len(m.games) for m in metas)

    # -- snapshots --------------------------------------------------------------------------

    def maybe_snapshot(self, policy_version: int, journal: Journal) -> None:
        """Start a snapshot of the main player if one is due (the scheduler's tick); it joins
        the league through `journal`."""
        if policy_version < 0 or not self.league.snapshot_due(policy_version):
            return
        if not self._snapshotting.acquire(blocking=False):
            return  # one is being taken
        threading.Thread(target=self._snapshot, args=(journal,), name="league-snapshot",
                         daemon=True).start()

    def _snapshot(self, journal: Journal) -> None:
        try:
            got = self.storage.get_weights()
            if got is None:
                return
            version, blob = got
            if not self.league.snapshot_due(version):
                return
            self.storage.put_blob(snapshot_blob(version), blob)
            before = {p.name: p.policy_version for p in self.league.snapshots()}
            journal({"kind": "snapshot", "version": version},
                    lambda: self.league.add_snapshot(version))
            after = {p.name for p in self.league.snapshots()}
            log.info("league: snapshot of policy version %d joins (%d snapshots)", version,
                     len(after))
            for gone, gone_version in before.items():
                if gone not in after and gone_version is not None:
                    self.storage.delete_blob(snapshot_blob(gone_version))
        except StorageError as err:  # tried again at the next tick
            self.snapshot_failures += 1
            log.warning("league snapshot not taken (storage): %s", err)
        except Exception:  # the scheduler goes on; the next tick tries again
            self.snapshot_failures += 1
            log.exception("league snapshot failed")
        finally:
            self._snapshotting.release()

    def apply(self, event: dict[str, Any]) -> None:
        """A journalled league change, replayed."""
        self.league.apply(event)

    # -- evaluation -------------------------------------------------------------------------

    def eval_opponents(self) -> list[Opponent]:
        return eval_opponents(self.league)

    def solved(self, result: EvaluationResult) -> str | None:
        """Why the run is solved by this evaluation, or None."""
        return solved_by(self.settings, result.battles, self.league.first_snapshot)

    # -- what people see, and what a snapshot keeps -----------------------------------------

    def view(self, history: bool = False) -> dict[str, Any]:
        return self.league.view(history)

    def scalars(self) -> dict[str, float]:
        """The league's figures for the run's `info` scope."""
        out = {"league/games": float(self.league.games),
               "league/snapshots": float(len(self.league.snapshots()))}
        main = self.league.players.get(MAIN)
        if main is not None:
            out.update({"league/main/mu": main.mu, "league/main/sigma": main.sigma,
                        "league/main/ordinal": main.ordinal()})
        return out

    def write_view(self, now: float, final: bool = False) -> None:
        """`league.json` in the run directory, every few seconds (for `rlfleet plot`)."""
        if self.run_dir is None or (not final
                                    and now - self._written_at < VIEW_WRITE_INTERVAL_S):
            return
        self._written_at = now
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.run_dir / "league.json.tmp"
            tmp.write_text(json.dumps(self.view(history=True)))
            tmp.replace(self.run_dir / "league.json")
        except OSError as err:
            log.warning("could not write league.json: %s", err)

    def state(self) -> dict[str, Any]:
        return self.league.state()

    def restore(self, state: dict[str, Any] | None) -> None:
        if state:
            self.league.restore(state)

