"""Games on real PettingZoo envs: the learning side's transitions span the opponent's reply,
carry the masks it acted under, end on the game's end, and add up to the outcome; illegal
actions and env ids that are no two-player game are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo", reason="the games extra: pip install -e '.[games]'")

from rlfleet.shared.envs.games.match import GameError, make_game, play, random_actor  # noqa: E402
from rlfleet.shared.envs.games.tictactoe import board_from_planes, perfect_move  # noqa: E402


@pytest.mark.parametrize("env_id", ["tictactoe_v3", "connect_four_v3"])
@pytest.mark.parametrize("learner_first", [True, False])
def test_the_learning_sides_transitions_add_up_to_the_game(env_id, learner_first):
    env = make_game(env_id)
    rng = np.random.default_rng(0)
    outcomes = set()
    for seed in range(30):
        game = play(env, random_actor(rng), random_actor(rng), learner_first, seed)
        cols = game.columns()
        n = len(cols["action"])
        mine = (game.plies + (1 if learner_first else 0)) // 2
        assert n == mine  # one transition per move of the learning side
        assert all(cols["action_mask"][i, a] for i, a in enumerate(cols["action"]))
        assert cols["terminated"][-1] and not cols["terminated"][:-1].any()
        assert not cols["truncated"].any()
        assert (cols["reward"][:-1] == 0).all()
        assert {"win": 1.0, "draw": 0.0, "loss": -1.0}[game.outcome] == cols["reward"][-1]
        # The next observation is the learning side's own next view: its obs at t + 1.
        assert np.array_equal(cols["next_obs"][:-1], cols["obs"][1:])
        assert np.array_equal(cols["next_action_mask"][:-1], cols["action_mask"][1:])
        outcomes.add(game.outcome)
    assert {"win", "loss"} <= outcomes


def test_the_perfect_player_never_loses_either_way():
    env = make_game("tictactoe_v3")
    rng = np.random.default_rng(3)

    def perfect(obs, mask):
        return perfect_move(board_from_planes(obs), rng)

    for learner_first in (True, False):
        games = [play(env, perfect, random_actor(rng), learner_first, seed, record=False)
                 for seed in range(60)]
        assert all(g.outcome != "loss" for g in games)
        assert all(g.obs == [] for g in games)  # evaluation keeps only the outcome


def test_an_illegal_action_is_refused():
    env = make_game("tictactoe_v3")

    def stubborn(obs, mask):
        return 0  # the first cell, taken or not

    with pytest.raises(GameError, match="illegal action 0"):
        play(env, stubborn, stubborn, True, seed=0)


@pytest.mark.parametrize("env_id,kwargs,match", [
    ("tictactoe_v9", {}, "use one of"),
    ("no.such.module:env", {}, "cannot import"),
    ("gymnasium:make", {"id": "CartPole-v1"}, "two-player"),  # a single-agent env
])
def test_a_bad_env_id_is_refused_by_name(env_id, kwargs, match):
    with pytest.raises(GameError, match=match):
        make_game(env_id, **kwargs)
