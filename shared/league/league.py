"""The league of a self-play run: its players, who has beaten whom, how strong each is, and
whom the main player meets next.

As in AlphaStar's league, the main player learns against a mix of itself, frozen snapshots
of its past and fixed bots. Opponents are drawn by prioritized fictitious self-play (PFSP):
the probability of meeting an opponent grows with how hard it is for the main player, so
training time goes where there is something to learn, while a small share of self-play keeps
the main player from overfitting to the league. Ratings are openskill's Plackett-Luce model,
one rating per player, updated by every game result; the payoff matrix keeps the raw counts.

Everything here is plain state and arithmetic behind a lock, no I/O: the coordinator feeds
it game results and new policy versions, snapshots it (`state`/`restore`) and journals each
change (`apply`), as it does for its buffers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rlfleet.shared.contract.config import LeagueConfig

MAIN = "main"
Outcome = Literal["win", "draw", "loss"]
OUTCOMES: tuple[Outcome, ...] = ("win", "draw", "loss")
_FLIP: dict[Outcome, Outcome] = {"win": "loss", "draw": "draw", "loss": "win"}


def snapshot_name(version: int) -> str:
    return f"snapshot-{version}"


def bot_name(bot: str) -> str:
    return f"bot-{bot}"


# -- PFSP -----------------------------------------------------------------------------------

def _hard(p: float, power: float) -> float:
    return (1.0 - p) ** power


def _variance(p: float, power: float) -> float:
    return p * (1.0 - p)


def _linear(p: float, power: float) -> float:
    return 1.0 - p


def _uniform(p: float, power: float) -> float:
    return 1.0


PFSP_WEIGHTINGS: dict[str, Callable[[float, float], float]] = {
    "hard": _hard,          # AlphaStar's f_hard: (1 - p)^power, the opponents it loses to
    "variance": _variance,  # p (1 - p): the opponents it is even with
    "linear": _linear,      # 1 - p
    "uniform": _uniform,    # plain fictitious self-play
}


def pfsp_probabilities(win_rates: Iterable[float], weighting: str = "hard",
                       power: float = 2.0) -> np.ndarray:
    """P(opponent i) = f(p_i) / sum_j f(p_j), p_i the main player's win rate against i;
    uniform when every weight is zero (it beats them all)."""
    f = PFSP_WEIGHTINGS[weighting]
    weights = np.array([f(min(max(p, 0.0), 1.0), power) for p in win_rates], dtype=np.float64)
    if weights.size == 0:
        return weights
    total = weights.sum()
    return weights / total if total > 0 else np.full(weights.size, 1.0 / weights.size)


# -- the payoff matrix ----------------------------------------------------------------------

class Payoff:
    """Win, draw and loss counts between every two players, from the row player's side."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}

    def record(self, player: str, opponent: str, outcome: Outcome) -> None:
        self.counts.setdefault((player, opponent), [0, 0, 0])[OUTCOMES.index(outcome)] += 1
        if opponent != player:
            flipped = OUTCOMES.index(_FLIP[outcome])
            self.counts.setdefault((opponent, player), [0, 0, 0])[flipped] += 1

    def games(self, player: str, opponent: str) -> int:
        return sum(self.counts.get((player, opponent), (0, 0, 0)))

    def win_rate(self, player: str, opponent: str, prior: float = 0.5) -> float:
        """Wins plus half the draws over games; `prior` before any game."""
        win, draw, loss = self.counts.get((player, opponent), (0, 0, 0))
        games = win + draw + loss
        return prior if games == 0 else (win + 0.5 * draw) / games


# -- players and ratings --------------------------------------------------------------------

@dataclass
class Player:
    name: str
    kind: Literal["main", "snapshot", "bot"]
    policy_version: int | None = None  # the frozen version of a snapshot
    mu: float = 25.0
    sigma: float = 25.0 / 3.0
    games: int = 0
    ratings: list[tuple[int, float, float]] = field(default_factory=list)  # (game, mu, sigma)
    stride: int = 1  # rated games between two points of `ratings`

    def ordinal(self) -> float:
        """The conservative skill estimate people rank by: mu - 3 sigma."""
        return self.mu - 3.0 * self.sigma


class Ratings:
    """openskill's Plackett-Luce model, one player per team."""

    def __init__(self) -> None:
        from openskill.models import PlackettLuce  # the games extra: only leagues need it

        self.model = PlackettLuce()

    def rate(self, a: Player, b: Player, outcome: Outcome) -> None:
        """Update both ratings with one game `a` played against `b`."""
        ranks = {"win": [0, 1], "draw": [0, 0], "loss": [1, 0]}[outcome]
        ra = self.model.rating(mu=a.mu, sigma=a.sigma)
        rb = self.model.rating(mu=b.mu, sigma=b.sigma)
        [[na], [nb]] = self.model.rate([[ra], [rb]], ranks=ranks)
        a.mu, a.sigma, b.mu, b.sigma = na.mu, na.sigma, nb.mu, nb.sigma


# -- the league -----------------------------------------------------------------------------

class League:
    """The players and their record. Thread-safe: HTTP threads read it while task
    assignment and result reports change it."""

    def __init__(self, settings: LeagueConfig | None = None, rating_history: int = 500
                 ) -> None:
        self.settings = settings or LeagueConfig()
        self.rating_history = rating_history  # rating points kept per player, for plots
        if self.settings.weighting not in PFSP_WEIGHTINGS:
            raise ValueError(f"league.weighting must be one of {sorted(PFSP_WEIGHTINGS)}, "
                             f"not {self.settings.weighting!r}")
        self._lock = threading.Lock()
        self._ratings = Ratings()
        self.players: dict[str, Player] = {MAIN: Player(MAIN, "main")}
        for bot in self.settings.bots:
            self.players[bot_name(bot)] = Player(bot_name(bot), "bot")
        self.payoff = Payoff()
        self.games = 0
        self.first_snapshot: str | None = None

    # -- changes (each one a journal record: `apply` replays them) -------------------------

    def apply(self, record: dict[str, Any]) -> None:
        """Replay one change: {"kind": "game", ...}, {"kind": "snapshot", ...} or
        {"kind": "drop", ...}."""
        if record["kind"] == "game":
            self.record_game(record["player"], record["opponent"], record["outcome"])
        elif record["kind"] == "snapshot":
            self.add_snapshot(int(record["version"]))
        elif record["kind"] == "drop":
            self.drop(str(record["name"]))
        else:
            raise ValueError(f"unknown league record {record['kind']!r}")

    def record_game(self, player: str, opponent: str, outcome: Outcome) -> None:
        """One finished game; unknown players (a snapshot dropped meanwhile) count in the
        payoff but not in ratings."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        with self._lock:
            self.games += 1
            self.payoff.record(player, opponent, outcome)
            a, b = self.players.get(player), self.players.get(opponent)
            if a is None or b is None or a is b:
                return  # self-play says nothing about relative strength
            self._ratings.rate(a, b, outcome)
            for p in (a, b):
                p.games += 1
                # The whole run at falling resolution: a point every `stride` rated games;
                # when full, every other point goes and the stride doubles.
                if p.games % p.stride == 0:
                    p.ratings.append((self.games, p.mu, p.sigma))
                    if len(p.ratings) > self.rating_history:
                        p.ratings = p.ratings[1::2]
                        p.stride *= 2

    def drop(self, name: str) -> bool:
        """Remove a snapshot nobody can load (its weights are gone); bots and the main
        player stay. Its games stay in the payoff."""
        with self._lock:
            player = self.players.get(name)
            if player is None or player.kind != "snapshot":
                return False
            del self.players[name]
            if name == self.first_snapshot:
                self.first_snapshot = None  # the next to join becomes the fixed point
            return True

    def snapshots(self) -> list[Player]:
        """Snapshots, oldest first."""
        with self._lock:
            return self._snapshots()

    def add_snapshot(self, version: int) -> str:
        """Freeze policy `version` as a player; it starts from the main player's rating.
        Beyond `max_snapshots`, the oldest leave, except the first: the league's fixed
        point, against which how far the main player has come is measured."""
        with self._lock:
            name = snapshot_name(version)
            if name not in self.players:
                main = self.players[MAIN]
                self.players[name] = Player(name, "snapshot", version, main.mu, main.sigma)
                snapshots = self._snapshots()
                if self.first_snapshot is None:
                    self.first_snapshot = name
                evictable = [p for p in snapshots if p.name != self.first_snapshot]
                kept = self.settings.max_snapshots - (len(snapshots) - len(evictable))
                for old in evictable[:max(0, len(evictable) - kept)]:
                    del self.players[old.name]
            return name

    # -- questions -------------------------------------------------------------------------

    def snapshot_due(self, version: int) -> bool:
        """Should policy `version` of the main player join the league as a snapshot?"""
        s = self.settings
        with self._lock:
            snapshots = self._snapshots()
            if not snapshots:
                return True  # the first version ever seen: the league's first past self
            newest = snapshots[-1]
            assert newest.policy_version is not None
            if version - newest.policy_version >= s.snapshot_every_versions:
                return True
            return (version > newest.policy_version
                    and self.payoff.games(MAIN, newest.name) >= s.snapshot_min_games
                    and self.payoff.win_rate(MAIN, newest.name) >= s.snapshot_win_rate)

    def opponents(self) -> list[str]:
        """Whom PFSP draws from: every snapshot and bot."""
        with self._lock:
            return [p.name for p in self.players.values() if p.kind != "main"]

    def probabilities(self) -> dict[str, float]:
        """The chance of meeting each opponent in the next game, self-play included."""
        s = self.settings
        with self._lock:
            pool = [p.name for p in self.players.values() if p.kind != "main"]
            rates = [self.payoff.win_rate(MAIN, name) for name in pool]
        self_share = 1.0 if not pool else s.self_play_fraction
        out = {MAIN: self_share}
        for name, p in zip(pool, pfsp_probabilities(rates, s.weighting, s.power),
                           strict=True):
            out[name] = (1.0 - self_share) * float(p)
        return out

    def pick_opponent(self, rng: np.random.Generator) -> Player:
        """Draw the next opponent of the main player."""
        probs = self.probabilities()
        names = list(probs)
        weights = np.array([probs[n] for n in names])
        name = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        with self._lock:
            return self.players[name]

    def _snapshots(self) -> list[Player]:
        return sorted((p for p in self.players.values() if p.kind == "snapshot"),
                      key=lambda p: p.policy_version or 0)

    # -- what people see, and what a snapshot keeps -----------------------------------------

    def view(self, history: bool = False) -> dict[str, Any]:
        """Players by ordinal, the payoff matrix between them and the chance of meeting each
        next (`/api/v1/league`); with `history`, each player's (game, mu, sigma) points."""
        probabilities = {name: round(p, 6) for name, p in self.probabilities().items()}
        with self._lock:
            players = sorted(self.players.values(), key=lambda p: -p.ordinal())
            names = [p.name for p in players]
            return {
                "games": self.games,
                "first_snapshot": self.first_snapshot,
                "players": [{"name": p.name, "kind": p.kind, "policy_version": p.policy_version,
                             "mu": round(p.mu, 4), "sigma": round(p.sigma, 4),
                             "ordinal": round(p.ordinal(), 4), "games": p.games}
                            for p in players],
                "probabilities": probabilities,
                **({"ratings": {p.name: [[g, round(m, 4), round(sd, 4)]
                                         for g, m, sd in p.ratings] for p in players}}
                   if history else {}),
                "payoff": {"players": names,
                           "win": [[self.payoff.counts.get((a, b), [0, 0, 0])[0] for b in names]
                                   for a in names],
                           "draw": [[self.payoff.counts.get((a, b), [0, 0, 0])[1] for b in names]
                                    for a in names],
                           "loss": [[self.payoff.counts.get((a, b), [0, 0, 0])[2] for b in names]
                                    for a in names]},
            }

    def state(self) -> dict[str, Any]:
        """Everything needed to rebuild the league (JSON-able)."""
        with self._lock:
            return {"games": self.games, "first_snapshot": self.first_snapshot,
                    "players": [{"name": p.name, "kind": p.kind,
                                 "policy_version": p.policy_version, "mu": p.mu,
                                 "sigma": p.sigma, "games": p.games,
                                 "ratings": [list(r) for r in p.ratings],
                                 "stride": p.stride}
                                for p in self.players.values()],
                    "payoff": [[a, b, *c] for (a, b), c in self.payoff.counts.items()]}

    def restore(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.games = int(state["games"])
            self.first_snapshot = state.get("first_snapshot")
            self.players = {}
            for p in state["players"]:
                self.players[p["name"]] = Player(
                    p["name"], p["kind"], p["policy_version"], float(p["mu"]),
                    float(p["sigma"]), int(p["games"]),
                    [(int(g), float(m), float(s)) for g, m, s in p["ratings"]],
                    int(p.get("stride", 1)))
            for bot in self.settings.bots:  # a bot added to the config since
                self.players.setdefault(bot_name(bot), Player(bot_name(bot), "bot"))
            self.payoff = Payoff()
            for a, b, win, draw, loss in state["payoff"]:
                self.payoff.counts[(a, b)] = [int(win), int(draw), int(loss)]

