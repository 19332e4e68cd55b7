"""Fixed opponents of a league: players that never learn, so beating them means something.

A bot is an `Actor` (observation, action mask -> action) made for one game from its name:
`random` plays any game, `perfect` is the exact tic-tac-toe solver, and a user's own bot is
`package.module:make_bot`, a callable taking `(env_id, rng)` and returning an actor.
"""

from __future__ import annotations

import numpy as np

from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.plugins import PluginKind, load_plugin
from rlfleet.shared.envs.games.match import Actor, GameError, random_actor
from rlfleet.shared.envs.games.tictactoe import board_from_planes, perfect_move

# A user's bot by import path: `make_bot(env_id, rng)` answering an `Actor`.
BOT = PluginKind("bot", callable_ok=True)


def perfect_actor(rng: np.random.Generator) -> Actor:
    """The tic-tac-toe solver, picking at random among equally good moves (so it does not
    play one fixed game that a policy could learn by heart)."""
    return lambda obs, mask: perfect_move(board_from_planes(obs), rng)


def make_bot(bot: str, env_id: str, rng: np.random.Generator) -> Actor:
    if bot == "random":
        return random_actor(rng)
    if bot == "perfect":
        if env_id != "tictactoe_v3":
            raise GameError(f"bot 'perfect' plays tictactoe_v3, not {env_id!r}")
        return perfect_actor(rng)
    module_name, _, attr = bot.partition(":")
    if not attr:
        raise GameError(f"bot {bot!r}: use 'random', 'perfect' or 'package.module:make_bot'")
    try:
        factory = load_plugin(bot, "league.bots", BOT)
    except ConfigError as err:
        raise GameError(f"bot {bot!r}: cannot import it ({err})") from err
    return factory(env_id, rng)
