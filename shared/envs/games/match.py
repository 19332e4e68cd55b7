"""One game of a two-player, turn-based PettingZoo env (AEC API) between two actors, and the
transitions of the side that learns.

A battle collector and an evaluator both play games this way; only the learning side's
transitions are kept, and one of them spans the opponent's reply: the observation after it
is the one the learning side sees at its next turn, and the reward is what it got since
(PettingZoo's `last()` accumulates it). Both sides see observations from their own point of
view, so the same actor can play first or second, and itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.plugins import PluginKind, load_plugin
from rlfleet.shared.contract.spec import EnvSpec

Outcome = Literal["win", "draw", "loss"]
Actor = Callable[[np.ndarray, np.ndarray], int]  # (observation, action mask) -> action

# The classic games people start with, by their PettingZoo names.
CLASSIC = {"tictactoe_v3": "pettingzoo.classic.tictactoe.tictactoe:env",
           "connect_four_v3": "pettingzoo.classic.connect_four.connect_four:env"}


class GameError(ValueError):
    """An env id that names no two-player game, or an actor that broke the rules."""


# A two-player game by import path: a function (or class) that makes a PettingZoo AEC env.
GAME = PluginKind("game", callable_ok=True)


@runtime_checkable
class HasAgents(Protocol):
    """A PettingZoo env: it names its agents."""

    possible_agents: list[str]


def make_game(env_id: str, **kwargs: Any) -> Any:
    """A PettingZoo AEC env: a classic game by name (`tictactoe_v3`), or a user's own by
    import path (`package.module:make_env`)."""
    target = CLASSIC.get(env_id, env_id)
    module_name, _, attr = target.partition(":")
    if not attr:
        raise GameError(f"env id {env_id!r}: use one of {sorted(CLASSIC)} or "
                        "'module:callable' for your own PettingZoo AEC env")
    try:
        make = load_plugin(target, "env.id", GAME)
    except ConfigError as err:
        raise GameError(f"env id {env_id!r}: cannot import {target!r} ({err}); the classic "
                        "games need the games extra: pip install -e '.[games]'") from err
    env = make(**kwargs)
    agents = env.possible_agents if isinstance(env, HasAgents) else None
    if agents is None or len(agents) != 2:
        raise GameError(f"env id {env_id!r} is not a two-player AEC env "
                        f"(possible_agents: {agents})")
    return env


def game_spec(env_id: str, kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """What a policy needs to know to play `env_id`: the shape of one side's observation
    and the number of actions (the same for both sides)."""
    env = make_game(env_id, **(kwargs or {}))
    try:
        agent = env.possible_agents[0]
        obs_space, act_space = env.observation_space(agent), env.action_space(agent)
    finally:
        env.close()
    spaces = getattr(obs_space, "spaces", None)
    if not isinstance(spaces, dict) or "observation" not in spaces or \
            "action_mask" not in spaces:
        raise GameError(f"env id {env_id!r} must observe a Dict of 'observation' and "
                        f"'action_mask'; it observes {obs_space}")
    n = getattr(act_space, "n", None)
    if n is None:
        raise GameError(f"env id {env_id!r} has action space {act_space}; a game needs a "
                        "discrete one")
    return EnvSpec(obs_shape=tuple(spaces["observation"].shape), n_actions=int(n))


@dataclass
class Game:
    """What one game left: the outcome for the learning side and its transitions."""

    outcome: Outcome
    plies: int
    learner_first: bool
    obs: list[np.ndarray] = field(default_factory=list)
    mask: list[np.ndarray] = field(default_factory=list)
    action: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    next_obs: list[np.ndarray] = field(default_factory=list)
    next_mask: list[np.ndarray] = field(default_factory=list)
    terminated: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    extras: dict[str, list[Any]] = field(default_factory=dict)  # what the policy's act kept

    def __len__(self) -> int:
        return len(self.action)

    def columns(self, start: int = 0) -> dict[str, np.ndarray]:
        """Transitions `start`.. as a chunk's columns (`action_mask`, `next_action_mask`
        beside the usual fields, and the acting policy's extras)."""
        out: dict[str, np.ndarray] = {
            "obs": np.asarray(self.obs[start:], dtype=np.float32),
            "action": np.asarray(self.action[start:], dtype=np.int64),
            "reward": np.asarray(self.reward[start:], dtype=np.float32),
            "next_obs": np.asarray(self.next_obs[start:], dtype=np.float32),
            "terminated": np.asarray(self.terminated[start:], dtype=bool),
            "truncated": np.asarray(self.truncated[start:], dtype=bool),
            "action_mask": np.asarray(self.mask[start:], dtype=bool),
            "next_action_mask": np.asarray(self.next_mask[start:], dtype=bool)}
        for key, values in self.extras.items():
            out[key] = np.asarray(values[start:], dtype=np.float32)
        return out


class Table:
    """One game in progress, moved one ply at a time by whoever is to move.

    A battle collector keeps many tables and moves all of them at once, so each side's
    policy acts on a batch of boards (one forward pass for all the learning side's moves);
    `play` is the same thing for one table. The learning side's transitions span the
    opponent's reply: PettingZoo's `last()` hands each agent its reward accumulated since its
    previous move, which is what the learning side's last move earned."""

    def __init__(self, env: Any, record: bool = True) -> None:
        self.env = env
        self.record = record
        self.game = Game("draw", 0, True)
        self.done = True
        self.mine = False  # the learning side is to move
        self.obs = np.zeros(0)
        self.mask = np.zeros(0, dtype=bool)
        self._me = ""
        self._pending: tuple[np.ndarray, np.ndarray, int, dict[str, Any]] | None = None
        self._total = 0.0

    def reset(self, seed: int, learner_first: bool) -> None:
        self.env.reset(seed=seed)
        first, second = self.env.possible_agents
        self._me = first if learner_first else second
        self.game = Game("draw", 0, learner_first)
        self._pending = None
        self._total = 0.0
        self.done = False
        self._advance()

    def move(self, action: int, extras: dict[str, Any] | None = None) -> None:
        """Play `action` for the side to move (`extras`: what the learning side's policy
        returned beside it, kept with the transition)."""
        action = int(action)
        if not 0 <= action < self.mask.size or not self.mask[action]:
            side = "the learning side" if self.mine else "the opponent"
            raise GameError(f"{side} chose illegal action {action} "
                            f"(legal: {np.flatnonzero(self.mask).tolist()})")
        if self.mine:
            self._pending = (self.obs, self.mask, action, extras or {})
        self.env.step(action)
        self.game.plies += 1
        self._advance()

    def _advance(self) -> None:
        """Pass the turns of sides whose game is over, recording the learning side's last
        transition, until someone must move or nobody is left."""
        env = self.env
        while env.agents:
            agent = env.agent_selection
            observation, reward, terminated, truncated, _ = env.last()
            obs, mask = _split(observation)
            if agent == self._me:
                self._total += float(reward)
                if self._pending is not None and self.record:
                    _add(self.game, self._pending, float(reward), obs, mask, terminated,
                         truncated and not terminated)
                self._pending = None
            if terminated or truncated:
                env.step(None)
                continue
            self.mine, self.obs, self.mask = agent == self._me, obs, mask
            return
        self.done = True
        self.game.outcome = ("win" if self._total > 0 else "loss" if self._total < 0
                             else "draw")


def play(env: Any, learner: Actor, opponent: Actor, learner_first: bool, seed: int,
         record: bool = True) -> Game:
    """Play one game; `record=False` (evaluation) keeps only the outcome."""
    table = Table(env, record)
    table.reset(seed, learner_first)
    while not table.done:
        actor = learner if table.mine else opponent
        table.move(actor(table.obs, table.mask))
    return table.game


def _split(observation: Any) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(observation, dict) and "action_mask" in observation:
        return (np.asarray(observation["observation"]),
                np.asarray(observation["action_mask"]).astype(bool))
    raise GameError("a two-player game must observe {'observation', 'action_mask'}, as "
                    "PettingZoo's classic games do")


def _add(game: Game, pending: tuple[np.ndarray, np.ndarray, int, dict[str, Any]],
         reward: float, next_obs: np.ndarray, next_mask: np.ndarray, terminated: bool,
         truncated: bool) -> None:
    obs, mask, action, extras = pending
    for key, value in extras.items():
        game.extras.setdefault(key, []).append(value)
    game.obs.append(obs)
    game.mask.append(mask)
    game.action.append(action)
    game.reward.append(reward)
    game.next_obs.append(next_obs)
    game.next_mask.append(next_mask)
    game.terminated.append(terminated)
    game.truncated.append(truncated)


def random_actor(rng: np.random.Generator) -> Actor:
    """The random bot: a uniformly drawn legal action."""
    return lambda obs, mask: int(rng.choice(np.flatnonzero(mask)))
