"""Battle collection and evaluation: the learning policy plays a two-player game against
opponents the coordinator's league assigns, and only its own side's moves become experience.

A collector keeps `env.num_envs` tables (one PettingZoo AEC env each) and moves all of them
each round: the learning side's pending moves in one batched `act`, each opponent policy's in
one batched `act_eval`, bots one board at a time. Each new game takes the next opponent from
the queue the coordinator fills (with the collect task, then with each chunk report's
answer), so the league's prioritized fictitious self-play decides the mix game by game.
Tables alternate who moves first.

Chunks are cut like the single-agent rollout's (`shared/rollout/rollout.py`): by *samples*
(`chunk_size` transitions; a game still running is cut, its last row marked `cut` and, for
policies that bootstrap, valued) or by *episodes* (`episodes_per_chunk` whole games). Each
chunk lists the games that ended in it, with both sides' policy versions and the outcome,
and has a per-row `opponent_version` column (-1 for a bot).

Opponents' weights: a snapshot's are read from storage (`snapshot_blob`) once and kept; a
snapshot that cannot be loaded is skipped with a warning (its games are played against the
learning policy itself) and named in the next chunk, so the league drops it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.contract.codec import CodecError, decode_weights
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.contract.wire.tasks import GameRecord, Opponent
from rlfleet.shared.envs.games.bots import make_bot
from rlfleet.shared.envs.games.match import Game, Table, make_game
from rlfleet.shared.infra.storage import Storage, StorageError, snapshot_blob
from rlfleet.shared.rollout.rollout import Chunk
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.collector")

MAIN = Opponent(name="main", kind="main")
BatchActor = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs, masks) -> actions


class OpponentPool:
    """Actors for league players: the learning policy itself, frozen snapshots (loaded from
    storage, the newest `max_policies` kept) and bots (one per name)."""

    def __init__(self, cfg: RunConfig, spec: EnvSpec, storage: Storage, seed: int,
                 max_policies: int = 8) -> None:
        self.cfg = cfg
        self.spec = spec
        self.storage = storage
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.max_policies = max_policies
        self._policies: OrderedDict[int, Policy] = OrderedDict()
        self._bots: dict[str, BatchActor] = {}
        self._actors: dict[tuple[str, int], BatchActor] = {}
        self._snapshot_actors: dict[tuple[str, int], BatchActor] = {}
        self.unloadable: set[str] = set()
        self.loads = 0

    def actor(self, opponent: Opponent, main: Policy
              ) -> tuple[BatchActor, int | None] | None:
        """(batch actor, its policy version) for `opponent`, or None if it cannot be loaded.
        Opponents that are policies sample their moves (`act_eval(deterministic=False)`): a
        greedy snapshot against a greedy learner would replay one game over and over."""
        if opponent.kind == "main":
            key = ("main", id(main))  # one actor per policy: its boards move in one batch
            if key not in self._actors:
                self._actors = {key: _policy_actor(main)}
            return self._actors[key], main.version
        if opponent.kind == "bot":
            assert opponent.bot is not None
            if opponent.bot not in self._bots:
                self._bots[opponent.bot] = _each(make_bot(opponent.bot, self.cfg.env.id,
                                                          self.rng))
            return self._bots[opponent.bot], None
        version = opponent.policy_version
        assert version is not None
        policy = self._snapshot(opponent.name, version)
        if policy is None:
            return None
        key = (opponent.name, id(policy))
        if key not in self._snapshot_actors:
            self._snapshot_actors = {k: a for k, a in self._snapshot_actors.items()
                                     if k[1] in {id(p) for p in self._policies.values()}}
            self._snapshot_actors[key] = _policy_actor(policy)
        return self._snapshot_actors[key], version

    def _snapshot(self, name: str, version: int) -> Policy | None:
        if version in self._policies:
            self._policies.move_to_end(version)
            return self._policies[version]
        if name in self.unloadable:
            return None
        try:
            blob = self.storage.get_blob(snapshot_blob(version))
            if blob is None:
                raise LookupError(f"no blob {snapshot_blob(version)!r} in storage")
            state, _ = decode_weights(blob)
            policy = make_policy(self.cfg.algo, self.spec, self.seed)
            policy.load_policy(version, state)
        except (LookupError, StorageError, CodecError, RuntimeError, ValueError) as err:
            # A snapshot that cannot be had is not worth stopping collection for.
            log.warning("league opponent %s (policy version %d) cannot be loaded; playing "
                        "its games against the learning policy instead: %s", name, version,
                        err)
            self.unloadable.add(name)
            return None
        self.loads += 1
        self._policies[version] = policy
        while len(self._policies) > self.max_policies:
            self._policies.popitem(last=False)
        return policy


def _policy_actor(policy: Policy) -> BatchActor:
    return lambda obs, mask: np.asarray(policy.act_eval(obs, False, mask=mask))


def _each(actor: Callable[[np.ndarray, np.ndarray], int]) -> BatchActor:
    return lambda obs, mask: np.array([actor(o, m) for o, m in zip(obs, mask, strict=True)])


@dataclass
class _Seat:
    """A table and the game on it: whom the learning side meets, with which versions."""

    table: Table
    opponent: Opponent = field(default_factory=lambda: MAIN)
    actor: BatchActor | None = None
    opponent_version: int | None = None
    version: int = -1  # the learning side's policy version when the game began
    emitted: int = 0  # transitions of this game already in a chunk (samples mode)
    games: int = 0


def _move_all(seats: list[_Seat], learner: Callable[[np.ndarray, np.ndarray], tuple[
        np.ndarray, dict[str, np.ndarray]]]) -> int:
    """One round: every table whose learning side is to move, in one batch, then every
    opponent's tables, one batch per opponent. Returns the learning side's moves."""
    mine = [s for s in seats if not s.table.done and s.table.mine]
    if mine:
        actions, extras = learner(np.stack([s.table.obs for s in mine]),
                                  np.stack([s.table.mask for s in mine]))
        for k, seat in enumerate(mine):
            seat.table.move(int(actions[k]), {key: float(v[k]) for key, v in extras.items()})
    by_actor: dict[int, list[_Seat]] = {}
    for seat in seats:
        if not seat.table.done and not seat.table.mine:
            by_actor.setdefault(id(seat.actor), []).append(seat)
    for group in by_actor.values():
        actor = group[0].actor
        assert actor is not None
        actions = actor(np.stack([s.table.obs for s in group]),
                        np.stack([s.table.mask for s in group]))
        for seat, action in zip(group, actions, strict=True):
            seat.table.move(int(action))
    return len(mine)


class BattleRollout:
    """The battle counterpart of `Rollout`: `collect()` returns the next chunk."""

    def __init__(self, cfg: RunConfig, policy: Policy, pool: OpponentPool,
                 next_opponent: Callable[[], Opponent], chunk_size: int = 256,
                 mode: str = "samples", episodes_per_chunk: int = 4, seed: int = 0) -> None:
        if mode not in ("samples", "episodes"):
            raise ValueError(f"collector.mode={mode!r}: expected 'samples' or 'episodes'")
        self.policy = policy
        self.pool = pool
        self.next_opponent = next_opponent
        self.chunk_size = chunk_size
        self.mode = mode
        self.episodes_per_chunk = episodes_per_chunk
        self.seed = seed
        self.seats = [_Seat(Table(make_game(cfg.env.id, **cfg.env.kwargs)))
                      for _ in range(cfg.env.num_envs)]
        self.env_steps = 0  # the learning side's moves
        self.games_played = 0
        self.bootstraps = policy.bootstrap(np.zeros((1, *pool.spec.obs_shape),
                                                    dtype=np.float32)) is not None
        self._finished: list[tuple[Game, int, GameRecord, int | None]] = []
        self._skipped: list[str] = []  # unloadable opponents for the next chunk to name
        self._named: set[str] = set()
        self._env_step = 0

    # -- games ------------------------------------------------------------------------------

    def _begin(self, i: int, seat: _Seat) -> None:
        opponent = self.next_opponent()
        got = self.pool.actor(opponent, self.policy)
        if got is None:
            if opponent.name not in self._named:  # once: the league drops it when told
                self._named.add(opponent.name)
                self._skipped.append(opponent.name)
            opponent, got = MAIN, self.pool.actor(MAIN, self.policy)
            assert got is not None
        seat.opponent, (seat.actor, seat.opponent_version) = opponent, got
        seat.version = self.policy.version
        seat.emitted = 0
        first = (i + seat.games) % 2 == 0  # each table alternates; neighbours differ
        seat.games += 1
        seat.table.reset(self.seed + 7919 * self.games_played + i, first)
        self.games_played += 1

    def _act(self, obs: np.ndarray, mask: np.ndarray
             ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        out = self.policy.act(obs, self._env_step, mask=mask)
        return out.actions, out.extras

    def _round(self) -> None:
        for i, seat in enumerate(self.seats):
            if seat.table.done:
                self._begin(i, seat)
        moved = _move_all(self.seats, self._act)
        self.env_steps += moved
        self._env_step += moved
        for seat in self.seats:
            if seat.table.done and seat.games:
                game = seat.table.game
                record = GameRecord(opponent=seat.opponent.name, policy_version=seat.version,
                                    opponent_version=seat.opponent_version,
                                    first=game.learner_first, outcome=game.outcome,
                                    plies=game.plies)
                self._finished.append((game, seat.emitted, record, seat.opponent_version))
                seat.emitted = len(game)  # the table is begun again next round

    # -- chunks -----------------------------------------------------------------------------

    def collect(self, env_step: int = 0) -> Chunk:
        self._env_step = max(self._env_step, env_step)
        while True:
            if self.mode == "episodes" and len(self._finished) >= self.episodes_per_chunk:
                # whole games; more than asked only if those had no move of the learning side
                rows = 0
                for n, (game, start, _, _) in enumerate(self._finished, 1):
                    rows += len(game) - start
                    if n >= self.episodes_per_chunk and rows > 0:
                        return self._chunk(self._take_finished(n), [])
            elif self.mode == "samples":
                done_rows = sum(len(g) - start for g, start, _, _ in self._finished)
                running = sum(len(s.table.game) - s.emitted for s in self.seats
                              if not s.table.done)
                if done_rows + running >= self.chunk_size:
                    return self._chunk(self._take_finished(len(self._finished)),
                                       self._take_running())
            self._round()

    def _take_finished(self, n: int) -> list[tuple[Game, int, GameRecord, int | None]]:
        out, self._finished = self._finished[:n], self._finished[n:]
        return out

    def _take_running(self) -> list[tuple[Game, int, int, _Seat]]:
        out = []
        for seat in self.seats:
            game = seat.table.game
            if not seat.table.done and len(game) > seat.emitted:
                out.append((game, seat.emitted, seat.version, seat))
                seat.emitted = len(game)
        return out

    def _chunk(self, finished: list[tuple[Game, int, GameRecord, int | None]],
               running: list[tuple[Game, int, int, _Seat]]) -> Chunk:
        blocks: list[dict[str, np.ndarray]] = []
        versions: list[int] = []
        returns: list[float] = []
        lengths: list[int] = []
        games: list[GameRecord] = []
        for game, start, record, opp_version in finished:
            games.append(record)
            returns.append({"win": 1.0, "draw": 0.0, "loss": -1.0}[game.outcome])
            lengths.append(len(game))
            if len(game) > start:
                blocks.append(self._block(game, start, opp_version, None))
                versions.append(record.policy_version)
        for game, start, version, seat in running:
            blocks.append(self._block(game, start, seat.opponent_version, game))
            versions.append(version)
        arrays = {key: np.concatenate([b[key] for b in blocks]) for key in blocks[0]}
        segments, row = [], 0
        for b in blocks:
            segments.append((row, len(b["reward"])))
            row += len(b["reward"])
        skipped, self._skipped = self._skipped, []
        return Chunk(arrays, min(versions), returns, lengths, segments,
                     games=games, opponents_skipped=skipped)

    def _block(self, game: Game, start: int, opponent_version: int | None,
               running: Game | None) -> dict[str, np.ndarray]:
        """One game's rows from `start`: its columns, `cut` on the last row and, for a game
        cut while running, the value of where it stopped."""
        cols = game.columns(start)
        n = len(cols["reward"])
        cut = np.zeros(n, dtype=bool)
        cut[-1] = True
        cols["cut"] = cut
        cols["opponent_version"] = np.full(n, -1 if opponent_version is None
                                           else opponent_version, dtype=np.int64)
        if self.bootstraps:
            boot = np.zeros(n, dtype=np.float32)
            if running is not None:
                value = self.policy.bootstrap(cols["next_obs"][-1:])
                boot[-1] = float(np.asarray(value).reshape(-1)[0])
            cols["bootstrap_value"] = boot
        return cols


# -- evaluation -----------------------------------------------------------------------------

@dataclass
class BattleTally:
    """Games against one opponent from one seat: the counts, and each game's result for
    the learning side (+1, 0, -1) and length in plies."""

    opponent: str
    first: bool
    win: int = 0
    draw: int = 0
    loss: int = 0
    returns: list[float] = field(default_factory=list)
    plies: list[int] = field(default_factory=list)


def battle_evaluate(cfg: RunConfig, policy: Policy, pool: OpponentPool,
                    opponents: list[Opponent], games: int, seed: int, tables: int = 16
                    ) -> list[BattleTally]:
    """`games` games against each opponent as first player and as many as second, the
    learning policy greedy (`act_eval(deterministic=True)`). An opponent that cannot be
    loaded is left out (the warning says why)."""
    tallies: list[BattleTally] = []
    work: list[tuple[BattleTally, BatchActor]] = []
    for opponent in opponents:
        got = pool.actor(opponent, policy)
        if got is None:
            continue
        for first in (True, False):
            tally = BattleTally(opponent.name, first)
            tallies.append(tally)
            work.extend((tally, got[0]) for _ in range(games))
    seats = [_Seat(Table(make_game(cfg.env.id, **cfg.env.kwargs), record=False))
             for _ in range(min(tables, max(1, len(work))))]
    owner: dict[int, BattleTally] = {}
    nxt = 0

    def greedy(obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, dict]:
        return np.asarray(policy.act_eval(obs, True, mask=mask)), {}

    while True:
        for i, seat in enumerate(seats):
            if seat.table.done:
                if i in owner:
                    tally = owner.pop(i)
                    game = seat.table.game
                    setattr(tally, game.outcome, getattr(tally, game.outcome) + 1)
                    tally.returns.append({"win": 1.0, "draw": 0.0, "loss": -1.0}[game.outcome])
                    tally.plies.append(game.plies)
                if nxt < len(work):
                    tally, actor = work[nxt]
                    seat.actor, owner[i] = actor, tally
                    seat.games += 1
                    seat.table.reset(seed + nxt, tally.first)
                    nxt += 1
        if all(s.table.done for s in seats):
            return tallies
        _move_all(seats, greedy)
