"""A self-play run's config: a bad game, bot or weighting is a config error naming its field,
at load where the file alone can tell, at the check where the game must be built."""

from __future__ import annotations

import pytest

pytest.importorskip("pettingzoo", reason="the games extra: pip install -e '.[games]'")

from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.run.check import check_runnable
from rlfleet.shared.run.config import parse_config


def _config(env_id: str = "tictactoe_v3", **league) -> dict:
    return {"env": {"id": env_id, "num_envs": 1}, "algo": {"name": "dqn"}, "league": league}


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_a_league_on_a_classic_game_checks_and_builds(algo):
    data = _config(bots=["random", "perfect"], weighting="variance")
    data["algo"] = {"name": algo}
    if algo == "ppo":
        data["buffers"] = {"rollouts": {"kind": "queue"}}
        data["learner"] = {"mix": [{"buffer": "rollouts", "fraction": 1.0}]}
    cfg = parse_config(data)
    assert cfg.league is not None and cfg.league.bots == ("random", "perfect")
    check_runnable(cfg, build=False)
    check_runnable(cfg, build=True)  # the policy is built for the game's spec


@pytest.mark.parametrize("data,field", [
    (_config("CartPole-v1"), "env.id"),
    (_config("connect_four_v3", bots=["perfect"]), "league.bots"),
    (_config(bots=["minimax"]), "league.bots"),
    (_config(bots=["random", "random"]), "league.bots"),
    (_config(weighting="hardest"), "league.weighting"),
    (_config(self_play_fraction=1.5), "league.self_play_fraction"),
])
def test_a_bad_league_is_refused_at_load_by_field(data, field):
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        parse_config(data)


@pytest.mark.parametrize("env_id,message", [
    ("no_such_module_here:make_env", "cannot import"),
    ("gymnasium:make", "two-player"),
])
def test_a_game_that_cannot_be_built_is_refused_at_the_check(env_id, message):
    data = _config(env_id)
    if env_id == "gymnasium:make":  # builds, but a single-agent env
        data["env"]["kwargs"] = {"id": "CartPole-v1"}
    cfg = parse_config(data)
    with pytest.raises(ConfigError, match=f"env.id='{env_id}'.*{message}"):
        check_runnable(cfg, build=False)
