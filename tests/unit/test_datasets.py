"""Datasets: Minari in and out, the buffer saver, the dataset buffer, the metric evaluator, and
bad datasets refused by field before anything trains on them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("minari", reason="the datasets extra: pip install -e '.[datasets]'")

from rlfleet.collector.saver import EpisodeSaver, read_saved  # noqa: E402
from rlfleet.learner.observe.dataset_eval import score  # noqa: E402
from rlfleet.shared.algos.bc import BehaviourCloning  # noqa: E402
from rlfleet.shared.algos.bc.config import BCConfig
from rlfleet.shared.algos.cql import CQL  # noqa: E402
from rlfleet.shared.algos.cql.config import CQLConfig
from rlfleet.shared.algos.dqn import DQN  # noqa: E402
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.contract.config import ConfigError, EnvConfig
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.contract.wire.experience import ChunkMeta  # noqa: E402
from rlfleet.shared.data.datasets import (  # noqa: E402
    DatasetError,
    check_datasets,
    discounted_returns,
    episodes,
    open_dataset,
    transitions,
    write_minari,
)
from rlfleet.shared.envs.make import env_spec, make_vector_env
from rlfleet.shared.infra.storage import DirectoryStorage  # noqa: E402
from rlfleet.shared.replay.replay import Replay  # noqa: E402
from rlfleet.shared.rollout.rollout import Rollout  # noqa: E402
from rlfleet.shared.run.config import parse_config

CARTPOLE = EnvSpec((4,), n_actions=2)


def _episode(rng: np.random.Generator, n: int, terminated: bool = True) -> dict:
    return {"observations": rng.normal(size=(n + 1, 4)).astype(np.float32) * 0.1,
            "actions": rng.integers(0, 2, size=n), "rewards": np.ones(n),
            "terminations": np.r_[np.zeros(n - 1, bool), terminated],
            "truncations": np.zeros(n, bool)}


def _write(tmp_path, eps, dataset_id="test/cartpole-v0"):
    envs = make_vector_env(EnvConfig(id="CartPole-v1"), 1, 0)
    path = write_minari(tmp_path / "datasets", dataset_id, eps, "CartPole-v1",
                        envs.single_observation_space, envs.single_action_space, "test", "t")
    envs.close()
    return path


def _offline(path, **eval_section) -> dict:
    return {"env": {"id": "CartPole-v1"}, "algo": {"name": "bc"},
            "buffers": {"data": {"kind": "dataset", "path": str(path)}},
            "learner": {"mix": [{"buffer": "data", "fraction": 1.0}]},
            "eval": {"every_env_steps": None, "every_train_iterations": 100, **eval_section}}


def test_episodes_round_trip_through_minari_as_transitions(tmp_path):
    import minari

    rng = np.random.default_rng(0)
    eps = [_episode(rng, 5), _episode(rng, 3, terminated=False)]
    path = _write(tmp_path, eps)
    ds = minari.MinariDataset(path / "data")
    assert ds.total_episodes == 2 and ds.total_steps == 8
    cols = transitions(episodes(open_dataset(path, None, "buffers.data"), CARTPOLE,
                                "buffers.data"), "buffers.data")
    np.testing.assert_allclose(cols["obs"][:5], eps[0]["observations"][:5])
    np.testing.assert_allclose(cols["next_obs"][:5], eps[0]["observations"][1:])
    np.testing.assert_array_equal(cols["action"], np.r_[eps[0]["actions"], eps[1]["actions"]])
    assert cols["cut"].tolist() == [False] * 4 + [True] + [False] * 2 + [True]
    assert cols["terminated"].tolist() == [False] * 4 + [True] + [False] * 3
    # an episode that ended neither way (a collector stopped) is truncated, not terminal
    assert cols["truncated"].tolist() == [False] * 7 + [True]
    assert cols["obs"].dtype == np.float32


@pytest.mark.parametrize("problem, match", [
    ("missing", "buffers.data.path=.*no Minari dataset"),
    ("shape", "buffers.data: observations of shape \\(3,\\)"),
    ("dtype", "buffers.data: episode 0 has actions of dtype float"),
    ("nan", "buffers.data: episode 1 has non-finite observations"),
    ("truncated", "buffers.data.*cannot be read"),
])
def test_bad_datasets_are_refused_by_field(tmp_path, problem, match):
    import gymnasium as gym

    rng = np.random.default_rng(1)
    eps = [_episode(rng, 4), _episode(rng, 4)]
    path = tmp_path / "nowhere"
    if problem == "shape":
        for ep in eps:
            ep["observations"] = ep["observations"][:, :3]
        path = write_minari(tmp_path / "d", "test/shape-v0", eps, "CartPole-v1",
                            gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), "t", "t")
    elif problem == "dtype":
        for ep in eps:
            ep["actions"] = ep["actions"].astype(np.float32)
        path = write_minari(tmp_path / "d", "test/dtype-v0", eps, "CartPole-v1",
                            gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2), "t", "t")
    elif problem == "nan":
        eps[1]["observations"][2, 1] = np.nan
        path = _write(tmp_path, eps)
    elif problem == "truncated":
        eps = [_episode(rng, 400) for _ in range(20)]
        path = _write(tmp_path, eps)
        data = path / "data" / "main_data.hdf5"
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    cfg = parse_config(_offline(path))
    with pytest.raises(DatasetError, match=match):
        check_datasets(cfg, env_spec(cfg.env))
    assert issubclass(DatasetError, ConfigError)


def test_dataset_configs_are_checked_by_field():
    base = _offline("x")
    with pytest.raises(ConfigError, match="exactly one of path and minari_id"):
        parse_config({**base, "buffers": {"data": {"kind": "dataset"}}})
    with pytest.raises(ConfigError, match="samples_per_insert.*read-only"):
        parse_config({**base, "buffers": {"data": {
            "kind": "dataset", "path": "x", "rate_limit": {"samples_per_insert": 4}}}})
    with pytest.raises(ConfigError, match="path and minari_id are for kind: dataset"):
        parse_config({"buffers": {"replay": {"path": "x"}}})
    with pytest.raises(ConfigError, match="insert_into names buffer 'data', a read-only"):
        parse_config({**base, "collector": {"insert_into": ["data"]}})
    with pytest.raises(ConfigError, match="eval.dataset needs exactly one"):
        parse_config({**base, "eval": {"dataset": {"metric": "td_error"}}})
    # offline-to-online: collected chunks go to the online buffer only
    cfg = parse_config({**base, "buffers": {"data": {"kind": "dataset", "path": "x"},
                                            "replay": {}},
                        "learner": {"mix": [{"buffer": "data", "fraction": 0.5},
                                            {"buffer": "replay", "fraction": 0.5}]}})
    assert cfg.receiving_buffers == ("replay",)


def test_a_dataset_buffer_is_read_only_and_outside_the_ledger(tmp_path):
    rng = np.random.default_rng(2)
    path = _write(tmp_path, [_episode(rng, 3000), _episode(rng, 2000)])
    cfg = parse_config({**_offline(path), "buffers": {
        "data": {"kind": "dataset", "path": str(path)}, "replay": {}}})
    storage = DirectoryStorage(tmp_path / "storage")
    replay = Replay(cfg, storage)
    data = replay.buffers["data"]
    assert len(data) == 5000 and replay.insert_into == ["replay"]
    assert sorted(storage.list_chunks()) == ["dataset-data-000000", "dataset-data-000001"]
    with pytest.raises(ValueError, match="read-only"):
        data.insert([], 0)
    fresh, _ = replay.insert([ChunkMeta(chunk_id="c1", length=8, policy_version=0)], 0)
    assert len(fresh) == 1 and len(replay.buffers["replay"]) == 8 and len(data) == 5000
    ledger = replay.ledger(acknowledged=1)
    assert ledger["balanced"] and ledger["in_buffers"] == 1
    refs = data.sample(64, 4, 0, 0)
    assert refs.rows.shape == (4, 64)
    # a restart reloads the dataset; the snapshot restores counters only
    state = replay.snapshot()
    Replay.write_snapshot(storage, state, {"ledger": {}}, 1)
    again = Replay(cfg, storage)
    again.load(storage)
    assert len(again.buffers["data"]) == 5000 and "dataset-data-000000" not in again.registry


def test_the_saver_writes_whole_episodes_across_chunks(tmp_path):
    envs = make_vector_env(EnvConfig(id="CartPole-v1"), 3, 0)
    policy = DQN(DQNConfig(eps_start=1.0, eps_end=1.0), CARTPOLE, 0)
    rollout = Rollout(envs, policy, chunk_size=30)  # 10 steps per env: episodes span chunks
    saver = EpisodeSaver(tmp_path / "eps", "collector-1", 3, "samples")
    returns, lengths = [], []
    for _ in range(40):
        chunk = rollout.collect(0)
        saver.add(chunk.arrays)
        returns += chunk.episode_returns
        lengths += chunk.episode_lengths
    saver.close()
    saved = list(read_saved(tmp_path / "eps"))
    assert sorted(len(ep["actions"]) for ep in saved) == sorted(lengths)
    assert len(saved) == len(lengths) > 10
    for ep in saved:
        assert len(ep["observations"]) == len(ep["actions"]) + 1
        assert np.abs(ep["observations"][0]).max() <= 0.05  # CartPole's reset state
        assert ep["terminations"][-1] or ep["truncations"][-1]
        assert not (ep["terminations"][:-1] | ep["truncations"][:-1]).any()
    envs.close()


def test_the_metric_evaluator_matches_a_hand_computation():
    """Q(s) = [s, 2s] on three steps of one episode, gamma 0.5 (worked out in the
    comments)."""
    policy = DQN(DQNConfig(), EnvSpec((1,), n_actions=2), 0)
    policy.q = nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        policy.q.weight.copy_(torch.tensor([[1.0], [2.0]]))
    data = {"obs": np.array([[1.0], [2.0], [3.0]], np.float32),
            "next_obs": np.array([[2.0], [3.0], [4.0]], np.float32),
            "action": np.array([0, 1, 1]), "reward": np.ones(3, np.float32),
            "terminated": np.array([False, False, True]),
            "cut": np.array([False, False, True])}
    returns = discounted_returns(data["reward"], data["cut"], 0.5)
    np.testing.assert_allclose(returns, [1.75, 1.5, 1.0])  # 1 + .5 (1 + .5 * 1), ...
    # greedy is action 1 everywhere (2s > s): right on 2 of 3 steps
    assert score("action_accuracy", policy, data, returns, 0.5) == pytest.approx(2 / 3)
    # targets 1 + .5*4 = 3, 1 + .5*6 = 4, 1 (terminal) against Q(s, a) = 1, 4, 6
    assert score("td_error", policy, data, returns, 0.5) == pytest.approx((2 + 0 + 5) / 3)
    # max Q = 2, 4, 6 against returns 1.75, 1.5, 1
    assert score("return_prediction", policy, data, returns, 0.5) == pytest.approx(
        (0.25 + 2.5 + 5) / 3)
    with pytest.raises(ConfigError, match="not QValues"):
        score("td_error", BehaviourCloning(BCConfig(), EnvSpec((1,), n_actions=2)), data,
              returns, 0.5)


def _batch(n=256, seed=0) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    return {"obs": torch.as_tensor(obs), "action": torch.as_tensor((obs[:, 2] > 0).astype(int)),
            "reward": torch.ones(n), "next_obs": torch.as_tensor(obs),
            "terminated": torch.zeros(n, dtype=torch.bool)}


def test_behaviour_cloning_fits_the_actions_it_is_shown():
    bc = BehaviourCloning(BCConfig(hidden_sizes=(32,), lr=3e-3), CARTPOLE, 0)
    batch = _batch()
    for _ in range(300):
        out = bc.learn(batch)
    assert float(out.metrics["accuracy"]) > 0.95
    actions = bc.act_eval(batch["obs"].numpy())
    assert (actions == batch["action"].numpy()).mean() > 0.95
    again = BehaviourCloning(BCConfig(hidden_sizes=(32,)), CARTPOLE, 1)
    again.load_state_dict(bc.state_dict())
    assert (again.act_eval(batch["obs"].numpy()) == actions).all()


def test_cql_keeps_the_datas_actions_ahead_of_the_rest():
    """Trained on one action per state, CQL values the other action lower; plain double DQN
    (alpha 0) has no reason to."""
    batch = _batch(seed=3)
    gaps = {}
    for alpha in (0.0, 2.0):
        cql = CQL(CQLConfig(cql_alpha=alpha, hidden_sizes=(32,), gamma=0.9), CARTPOLE, 0)
        for _ in range(300):
            out = cql.learn(batch)
        with torch.no_grad():
            q = cql.q(batch["obs"])
        taken = q.gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
        other = q.gather(1, 1 - batch["action"].long().unsqueeze(1)).squeeze(1)
        gaps[alpha] = float((taken - other).mean())
        assert "cql_gap" in out.metrics
    assert gaps[2.0] > 0.5 and gaps[2.0] > gaps[0.0] + 0.5, gaps
