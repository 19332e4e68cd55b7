"""learner/dqn.py (the double-DQN update) and learner/batching.py (`assemble`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner.batching import assemble
from learner.dqn import BATCH_FIELDS, DQNLearner
from shared.codec import decode_arrays, encode_arrays
from shared.config import DQNConfig
from shared.envs import EnvSpec

SPEC = EnvSpec(obs_shape=(2,), n_actions=3)


def _cfg(**kw) -> DQNConfig:
    base = dict(hidden_sizes=(3,), lr=0.01, gamma=0.9, target_update_every=1000,
                max_grad_norm=100.0)
    base.update(kw)
    return DQNConfig(**base)


def _state(w1, b1, w2, b2) -> dict[str, torch.Tensor]:
    return {"net.0.weight": torch.tensor(w1), "net.0.bias": torch.tensor(b1),
            "net.2.weight": torch.tensor(w2), "net.2.bias": torch.tensor(b2)}


# Online and target nets with hand-picked weights; on the next observations below they
# disagree about the best action, so double DQN and plain DQN give different targets.
ONLINE = _state([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [0.0, 0.0, -1.0],
                [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.5]], [0.0, 0.1, -0.2])
TARGET = _state([[0.5, 0.0], [0.0, 2.0], [1.0, -1.0]], [0.1, 0.0, 0.0],
                [[2.0, 0.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 3.0]], [0.0, 0.0, 0.5])


def _mlp(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The Q-network written out: Linear, ReLU, Linear."""
    h = torch.relu(x @ state["net.0.weight"].T + state["net.0.bias"])
    return h @ state["net.2.weight"].T + state["net.2.bias"]


def _huber(d: torch.Tensor) -> torch.Tensor:
    a = d.abs()
    return torch.where(a < 1.0, 0.5 * d * d, a - 0.5).mean()


def _batch() -> dict[str, torch.Tensor]:
    return {
        "obs": torch.tensor([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0], [0.0, 0.0]]),
        "action": torch.tensor([0, 1, 2, 1]),
        "reward": torch.tensor([-2.0, -2.3, -1.0, 5.0]),
        "next_obs": torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 1.0], [4.0, 0.5]]),
        "terminated": torch.tensor([False, False, True, False]),
    }


def _learner(cfg: DQNConfig | None = None) -> DQNLearner:
    learner = DQNLearner(cfg or _cfg(), SPEC, seed=0)
    learner.q.load_state_dict(ONLINE)
    learner.target.load_state_dict(TARGET)
    return learner


def _hand_target(batch, gamma: float, double: bool = True) -> torch.Tensor:
    q_next_online = _mlp(ONLINE, batch["next_obs"])
    q_next_target = _mlp(TARGET, batch["next_obs"])
    if double:
        a_star = q_next_online.argmax(dim=1)
        next_value = q_next_target[torch.arange(len(a_star)), a_star]
    else:
        next_value = q_next_target.max(dim=1).values
    not_done = 1.0 - batch["terminated"].float()
    return batch["reward"] + gamma * not_done * next_value


def test_the_hand_built_nets_disagree_so_the_test_tells_double_from_plain_dqn():
    batch = _batch()
    online_pick = _mlp(ONLINE, batch["next_obs"]).argmax(dim=1)
    target_pick = _mlp(TARGET, batch["next_obs"]).argmax(dim=1)
    assert (online_pick != target_pick).any()
    assert not torch.allclose(_hand_target(batch, 0.9), _hand_target(batch, 0.9, double=False))


def test_loss_is_the_double_dqn_huber_loss():
    batch = _batch()
    gamma = 0.9
    target = _hand_target(batch, gamma)
    q_sa = _mlp(ONLINE, batch["obs"])[torch.arange(4), batch["action"]]
    # the batch exercises both branches of the Huber loss
    assert ((q_sa - target).abs() < 1).any() and ((q_sa - target).abs() > 1).any()
    expected = _huber(q_sa - target)

    out = _learner(_cfg(gamma=gamma)).update(batch)

    torch.testing.assert_close(out["loss"], expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["q_mean"], q_sa.mean(), rtol=1e-6, atol=1e-6)
    plain = _huber(q_sa - _hand_target(batch, gamma, double=False))
    assert not torch.isclose(out["loss"], plain)
    assert all(v.dim() == 0 for v in out.values())


def test_terminated_transitions_do_not_bootstrap():
    batch = _batch()
    batch["terminated"] = torch.ones(4, dtype=torch.bool)
    q_sa = _mlp(ONLINE, batch["obs"])[torch.arange(4), batch["action"]]
    out = _learner().update(batch)
    torch.testing.assert_close(out["loss"], _huber(q_sa - batch["reward"]))


def test_gamma_zero_regresses_on_the_reward():
    batch = _batch()
    q_sa = _mlp(ONLINE, batch["obs"])[torch.arange(4), batch["action"]]
    out = _learner(_cfg(gamma=0.0)).update(batch)
    torch.testing.assert_close(out["loss"], _huber(q_sa - batch["reward"]))


def test_gradient_step_is_one_clipped_adam_step_on_the_online_net_only():
    batch = _batch()
    cfg = _cfg(lr=0.01, max_grad_norm=0.5)
    # the same loss by hand, with autograd on a copy of the online weights
    params = {k: v.clone().requires_grad_(True) for k, v in ONLINE.items()}
    q_sa = _mlp(params, batch["obs"])[torch.arange(4), batch["action"]]
    _huber(q_sa - _hand_target(batch, cfg.gamma)).backward()
    grads = {k: p.grad for k, p in params.items()}
    norm = torch.sqrt(sum((g * g).sum() for g in grads.values()))
    assert norm > cfg.max_grad_norm  # so clipping matters
    scale = cfg.max_grad_norm / (norm + 1e-6)

    learner = _learner(cfg)
    out = learner.update(batch)

    torch.testing.assert_close(out["grad_norm"], norm, rtol=1e-5, atol=1e-6)
    eps = 1e-8  # Adam's first step moves each weight by lr * g / (|g| + eps)
    for name, new in learner.q.state_dict().items():
        g = grads[name] * scale
        expected = ONLINE[name] - cfg.lr * g / (g.abs() + eps)
        torch.testing.assert_close(new, expected, rtol=1e-5, atol=1e-6, msg=name)
    for name, t in learner.target.state_dict().items():
        assert torch.equal(t, TARGET[name]), name
    assert learner.train_iterations == 1


def _random_batch(seed: int, n: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(n, 2, generator=g), "action": torch.randint(0, 3, (n,), generator=g),
            "reward": torch.randn(n, generator=g), "next_obs": torch.randn(n, 2, generator=g),
            "terminated": torch.rand(n, generator=g) < 0.2}


def _same(a: torch.nn.Module, b: torch.nn.Module | dict) -> bool:
    other = b if isinstance(b, dict) else b.state_dict()
    return all(torch.equal(v, other[k]) for k, v in a.state_dict().items())


def test_target_network_is_copied_every_target_update_every_iterations():
    learner = _learner(_cfg(target_update_every=3))
    copies = []
    for i in range(1, 8):
        before = {k: v.clone() for k, v in learner.target.state_dict().items()}
        learner.update(_random_batch(i))
        assert learner.train_iterations == i
        if i % 3 == 0:
            assert _same(learner.target, learner.q), f"no copy at iteration {i}"
            copies.append(i)
        else:
            assert _same(learner.target, before), f"target changed at iteration {i}"
            assert not _same(learner.target, learner.q)
    assert copies == [3, 6]
    # the copy is a copy: further updates of the online net leave the target alone
    snapshot = {k: v.clone() for k, v in learner.target.state_dict().items()}
    learner.update(_random_batch(99))
    assert _same(learner.target, snapshot)


def test_a_fresh_learner_starts_with_target_equal_to_online_and_frozen():
    learner = DQNLearner(_cfg(), SPEC, seed=3)
    assert _same(learner.target, learner.q)
    assert not any(p.requires_grad for p in learner.target.parameters())
    again = DQNLearner(_cfg(), SPEC, seed=3)
    assert _same(again.q, learner.q)


def test_policy_state_is_a_detached_copy():
    learner = _learner()
    state = learner.policy_state()
    assert set(state) == set(ONLINE)
    learner.update(_batch())
    assert all(torch.equal(state[k], ONLINE[k]) for k in state)
    assert not any(t.requires_grad for t in state.values())


# -- batching -------------------------------------------------------------------------------

def _chunk(k: int, n: int) -> dict[str, np.ndarray]:
    """Chunk k: row r carries the value 1000*k + r in every field, so a pick is traceable."""
    v = 1000 * k + np.arange(n)
    return {"obs": np.stack([v, -v], axis=1).astype(np.float32),
            "action": (v % 3).astype(np.int64),
            "reward": v.astype(np.float32),
            "next_obs": np.stack([v + 0.5, -v], axis=1).astype(np.float32),
            "terminated": (v % 2 == 0),
            "truncated": np.zeros(n, dtype=bool)}


def test_assemble_picks_exactly_the_referenced_rows():
    chunks = [_chunk(k, n) for k, n in enumerate([5, 1, 12, 3])]
    chunk_index = np.array([[0, 2, 2, 3, 1], [3, 3, 0, 1, 2], [2, 2, 2, 2, 2]])
    rows = np.array([[4, 0, 11, 2, 0], [0, 0, 1, 0, 7], [3, 3, 5, 6, 10]])
    batches = assemble(chunks, chunk_index, rows)
    assert len(batches) == 3
    for b, batch in enumerate(batches):
        assert set(batch) == set(BATCH_FIELDS)
        for i in range(chunk_index.shape[1]):
            src = chunks[chunk_index[b, i]]
            for f in BATCH_FIELDS:
                np.testing.assert_array_equal(batch[f][i].numpy(), src[f][rows[b, i]],
                                              err_msg=f"batch {b} item {i} field {f}")
        assert batch["obs"].shape == (5, 2)
        assert batch["obs"].dtype == torch.float32
        assert batch["action"].dtype == torch.int64
        assert batch["terminated"].dtype == torch.bool
    expected_rewards = [[4, 2000, 2011, 3002, 1000],
                        [3000, 3000, 1, 1000, 2007],
                        [2003, 2003, 2005, 2006, 2010]]
    assert [b["reward"].tolist() for b in batches] == expected_rewards


def test_assemble_with_one_chunk_and_selected_fields():
    chunk = _chunk(7, 4)
    [batch] = assemble([chunk], np.zeros((1, 3), dtype=np.int64), np.array([[3, 0, 3]]),
                       fields=("reward", "truncated"))
    assert set(batch) == {"reward", "truncated"}
    assert batch["reward"].tolist() == [7003, 7000, 7003]


def test_assemble_out_of_range_row_is_an_error_not_a_wrong_row():
    chunks = [_chunk(0, 3), _chunk(1, 3)]
    with pytest.raises(IndexError):
        assemble(chunks, np.array([[1]]), np.array([[3]]))


def test_decoded_chunks_assemble_into_batches_the_learner_trains_on():
    blobs = [encode_arrays(_chunk(k, n), {"policy_version": "0"}) for k, n in [(0, 6), (1, 9)]]
    chunks = [decode_arrays(b)[0] for b in blobs]
    rng = np.random.default_rng(0)
    chunk_index = rng.integers(0, 2, (4, 8))
    rows = rng.integers(0, 6, (4, 8))
    batches = assemble(chunks, chunk_index, rows)
    learner = DQNLearner(_cfg(), SPEC, seed=0)
    for batch in batches:
        # chunk values are large; scale them so the test only checks the plumbing
        batch = {**batch, "obs": batch["obs"] / 1000, "next_obs": batch["next_obs"] / 1000,
                 "reward": batch["reward"] / 1000}
        out = learner.update(batch)
        assert torch.isfinite(out["loss"])
    assert learner.train_iterations == 4
