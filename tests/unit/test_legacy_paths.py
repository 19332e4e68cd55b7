"""Import paths written before the package was `rlfleet` (in configs and in every run
directory's saved config) still resolve, each with one warning naming the path to write."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from rlfleet.shared.run.check import check_runnable
from rlfleet.shared.run.config import parse_config
from rlfleet.shared.util import imports
from rlfleet.shared.util.imports import (
    ImportPathError,
    RlfleetDeprecationWarning,
    current_path,
    load_object,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(imports, "_warned", set())


def test_an_old_path_resolves_with_one_warning_naming_the_new_one():
    from rlfleet.shared.algos.rnd.model import RND

    with pytest.warns(RlfleetDeprecationWarning,
                      match="algo.reward_model='shared.algos.rnd:RND' is an old import path: "
                            "write 'rlfleet.shared.algos.rnd:RND'"):
        assert load_object("shared.algos.rnd:RND", "algo.reward_model") is RND
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_object("shared.algos.rnd:RND", "algo.reward_model") is RND  # once


@pytest.mark.parametrize("old,new", [
    ("shared.algos.dqn:DQN", "rlfleet.shared.algos.dqn:DQN"),
    ("shared.algos.ppo:PPO", "rlfleet.shared.algos.ppo:PPO"),
    ("shared.bitflip:BitFlipEnv", "rlfleet.shared.envs.bitflip:BitFlipEnv"),
    ("shared.games.bots:perfect_actor", "rlfleet.shared.envs.games.bots:perfect_actor"),
])
def test_old_paths_name_the_same_objects(old, new):
    assert current_path(old) == new
    with pytest.warns(RlfleetDeprecationWarning):
        assert load_object(old, "x") is load_object(new, "x")


def test_paths_that_are_not_old_ones_are_left_alone(monkeypatch):
    """...and the repository's own folders are never imported under their old names, even
    from a directory where `shared` would be found."""
    monkeypatch.syspath_prepend(str(REPO))
    assert current_path("my_package.shared:Thing") is None
    assert current_path("shared.nothing_of_ours:X") is None
    with pytest.raises(ImportPathError, match=r"rlfleet.s modules are under .rlfleet\.. now"):
        load_object("shared.nothing_of_ours:X", "algo.policy")
    assert "shared" not in sys.modules  # nothing of the old layout was imported


def test_a_config_saved_by_the_previous_version_still_checks():
    """What a run directory's config.yaml held: old paths and `learner.by_buffer: null`."""
    cfg = parse_config({
        "env": {"id": "MountainCar-v0"},
        "algo": {"name": "dqn", "policy": "shared.algos.dqn:DQN",
                 "reward_model": {"path": "shared.algos.rnd:RND", "kwargs": {"scale": 2.0}}},
        "learner": {"by_buffer": None}})
    with pytest.warns(RlfleetDeprecationWarning):
        check_runnable(cfg)
