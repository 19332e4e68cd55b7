"""One game of a two-player, turn-based PettingZoo env (AEC API) between two actors, and the
transitions of the side that learns.

A battle collector and an evaluator both play games this way; only the learning side's
transitions are kept, and one of them spans the opponent's reply: the observation after it
is the one the learning side sees at its next turn, and the reward is what it got since
(PettingZoo's `last()` accumulates it). Both sides see observations from their own point of
view, so the same actor can play first or second, and itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from shared.envs import EnvSpec

Outcome = Literal["win", "draw", "loss"]
Actor = Callable[[np.ndarray, np.ndarray], int]  # (observation, action mask) -> action

# The classic games people start with, by their PettingZoo names.
CLASSIC = {"tictactoe_v3": "pettingzoo.classic.tictactoe.tictactoe:env",
           "connect_four_v3": "pettingzoo.classic.connect_four.connect_four:env"}


class GameError(ValueError):
    """An env id that names no two-player game, or an actor that broke the rules."""


def make_game(env_id: str, **kwargs: Any) -> Any:
    """A PettingZoo AEC env: a classic game by name (`tictactoe_v3`), or a user's own by
    import path (`package.module:make_env`)."""
    target = CLASSIC.get(env_id, env_id)
    module_name, _, attr = target.partition(":")
    if not attr:
        raise GameError(f"env id {env_id!r}: use one of {sorted(CLASSIC)} or "
                        "'module:callable' for your own PettingZoo AEC env")
    try:
        make = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise GameError(f"env id {env_id!r}: cannot import {target!r} ({err}); the classic "
                        "games need the games extra: pip install -e '.[games]'") from err
    env = make(**kwargs)
    agents = getattr(env, "possible_agents", None)
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

    def columns(self) -> dict[str, np.ndarray]:
        """The transitions as a chunk's columns (`action_mask`, `next_action_mask` beside
        the usual fields)."""
        return {"obs": np.asarray(self.obs, dtype=np.float32),
                "action": np.asarray(self.action, dtype=np.int64),
                "reward": np.asarray(self.reward, dtype=np.float32),
                "next_obs": np.asarray(self.next_obs, dtype=np.float32),
                "terminated": np.asarray(self.terminated, dtype=bool),
                "truncated": np.asarray(self.truncated, dtype=bool),
                "action_mask": np.asarray(self.mask, dtype=bool),
                "next_action_mask": np.asarray(self.next_mask, dtype=bool)}


def play(env: Any, learner: Actor, opponent: Actor, learner_first: bool, seed: int,
         record: bool = True) -> Game:
    """Play one game; `record=False` (evaluation) keeps only the outcome."""
    env.reset(seed=seed)
    first, second = env.possible_agents
    me = first if learner_first else second
    game = Game("draw", 0, learner_first)
    pending: tuple[np.ndarray, np.ndarray, int] | None = None  # my last move, unanswered
    total = 0.0
    for agent in env.agent_iter():
        observation, reward, terminated, truncated, _ = env.last()
        obs, mask = _split(observation)
        done = terminated or truncated
        if agent == me:
            total += float(reward)
            if pending is not None and record:
                _add(game, pending, float(reward), obs, mask, terminated,
                     truncated and not terminated)
            pending = None
            if done:
                env.step(None)
                continue
            action = int(learner(obs, mask))
            if not 0 <= action < mask.size or not mask[action]:
                raise GameError(f"the learning side chose illegal action {action} "
                                f"(legal: {np.flatnonzero(mask).tolist()})")
            pending = (obs, mask, action)
        else:
            if done:
                env.step(None)
                continue
            action = int(opponent(obs, mask))
            if not 0 <= action < mask.size or not mask[action]:
                raise GameError(f"the opponent chose illegal action {action}")
        env.step(action)
        game.plies += 1
    game.outcome = "win" if total > 0 else "loss" if total < 0 else "draw"
    return game


def _split(observation: Any) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(observation, dict) and "action_mask" in observation:
        return (np.asarray(observation["observation"]),
                np.asarray(observation["action_mask"]).astype(bool))
    raise GameError("a two-player game must observe {'observation', 'action_mask'}, as "
                    "PettingZoo's classic games do")


def _add(game: Game, pending: tuple[np.ndarray, np.ndarray, int], reward: float,
         next_obs: np.ndarray, next_mask: np.ndarray, terminated: bool,
         truncated: bool) -> None:
    obs, mask, action = pending
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
