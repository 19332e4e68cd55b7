"""learner/output/checkpoints.py with real storage and real policies: what is kept, what a restored
learner continues from, and that nothing needs pickle."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlfleet.learner.output.checkpoints import CheckpointStore
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.ppo import PPO
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.infra.storage import DirectoryStorage

SPEC = EnvSpec(obs_shape=(4,), n_actions=2)


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(32, 4, generator=g),
            "action": torch.randint(0, 2, (32,), generator=g),
            "reward": torch.randn(32, generator=g), "next_obs": torch.randn(32, 4, generator=g),
            "terminated": torch.zeros(32, dtype=torch.bool)}


def _store(storage, **kw) -> CheckpointStore:
    return CheckpointStore(storage, prefix="ckpt", keep_last=kw.pop("keep_last", 2),
                           metadata={"run": "test"}, **kw)


def test_keeps_the_last_k_plus_the_best(tmp_path):
    storage = DirectoryStorage(tmp_path)
    store = _store(storage)
    policy = DQN(DQNConfig(hidden_sizes=(8,)), SPEC, seed=0)
    for it, version in [(100, 4), (200, 8), (300, 12)]:
        store.save(policy.state_dict(), it, version)
    assert [e.train_iterations for e in store.entries] == [200, 300]
    assert storage.get_blob("ckpt-000000000100") is None
    # the best evaluation was of version 9: the checkpoint at or before it is protected
    assert store.mark_best(9) == "ckpt-000000000200"
    store.save(policy.state_dict(), 400, 16)
    store.save(policy.state_dict(), 500, 20)
    assert [e.train_iterations for e in store.entries] == [200, 400, 500]
    index = json.loads(storage.get_blob("ckpt-index"))
    assert index["best"] == "ckpt-000000000200"
    assert [c["name"] for c in index["checkpoints"]] == [e.name for e in store.entries]
    # a new store (a restarted learner) reads the same index
    again = _store(storage)
    assert [e.name for e in again.entries] == [e.name for e in store.entries]
    assert again.best == "ckpt-000000000200"
    assert again.mark_best(3) is None  # nothing that old is kept


@pytest.mark.parametrize("backend", ["directory", "redis"])
def test_a_restored_dqn_continues_exactly_where_it_stopped(tmp_path, redis_storage, backend):
    storage = DirectoryStorage(tmp_path) if backend == "directory" else redis_storage
    cfg = DQNConfig(hidden_sizes=(16,), target_update_every=3)
    a = DQN(cfg, SPEC, seed=1)
    for i in range(5):
        a.learn(_batch(i))
    _store(storage).save(a.state_dict(), a.train_iterations, 7)

    state, meta = _store(storage).latest()
    assert meta["train_iterations"] == "5" and meta["policy_version"] == "7"
    assert meta["run"] == "test"
    b = DQN(cfg, SPEC, seed=99)  # different initial weights, no optimizer history
    b.load_state_dict(state)
    assert b.train_iterations == 5
    for i in range(5, 9):  # same batches from here: same losses, same weights
        la, lb = a.learn(_batch(i)), b.learn(_batch(i))
        torch.testing.assert_close(la.metrics["loss"], lb.metrics["loss"])
    for pa, pb in zip(a.q.parameters(), b.q.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)
    for pa, pb in zip(a.target.parameters(), b.target.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)


def test_a_restored_ppo_has_the_same_weights_and_optimizer(tmp_path):
    storage = DirectoryStorage(tmp_path)
    cfg = PPOConfig(hidden_sizes=(8,), batch_size=16, rollout_size=32, epochs=2)
    a = PPO(cfg, SPEC, seed=2)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((32, 4)).astype(np.float32)
    out = a.act(obs, 0)
    batch = {"obs": torch.from_numpy(obs), "action": torch.from_numpy(out.actions),
             "reward": torch.ones(32), "terminated": torch.zeros(32, dtype=torch.bool),
             "cut": torch.tensor([False] * 31 + [True]),
             "log_prob": torch.from_numpy(out.extras["log_prob"]),
             "value": torch.from_numpy(out.extras["value"]),
             "bootstrap_value": torch.zeros(32)}
    a.learn(batch)
    _store(storage).save(a.state_dict(), a.train_iterations, 1)
    b = PPO(cfg, SPEC, seed=3)
    b.load_state_dict(_store(storage).latest()[0])
    assert b.train_iterations == a.train_iterations > 0
    for key, value in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[key], value, msg=key)


def test_no_checkpoint_means_none(tmp_path):
    assert _store(DirectoryStorage(tmp_path)).latest() is None
