"""shared/algos/dqn/policy.py (the double-DQN update), shared/batching/batching.py (`assemble`) and
learner/output/feedback.py (priorities back to the coordinator)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.learner.output.feedback import PriorityFeedback
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.batching.batching import DEFAULT_FIELDS, Batch, assemble
from rlfleet.shared.contract.codec import decode_arrays, encode_arrays
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.contract.wire.sampling import SamplePart

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


def _learner(cfg: DQNConfig | None = None) -> DQN:
    learner = DQN(cfg or _cfg(), SPEC, seed=0)
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

    result = _learner(_cfg(gamma=gamma)).learn(batch)
    out = result.metrics

    torch.testing.assert_close(out["loss"], expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["q_mean"], q_sa.mean(), rtol=1e-6, atol=1e-6)
    plain = _huber(q_sa - _hand_target(batch, gamma, double=False))
    assert not torch.isclose(out["loss"], plain)
    assert all(v.dim() == 0 for v in out.values())
    # |TD error| per item, against the double-DQN target: the new priorities
    torch.testing.assert_close(result.priorities, (target - q_sa).abs(), rtol=1e-6, atol=1e-6)
    assert result.priorities.shape == (4,) and not result.priorities.requires_grad


def test_importance_weights_scale_each_items_loss():
    batch = _batch()
    target = _hand_target(batch, 0.9)
    q_sa = _mlp(ONLINE, batch["obs"])[torch.arange(4), batch["action"]]
    d = q_sa - target
    per_item = torch.where(d.abs() < 1.0, 0.5 * d * d, d.abs() - 0.5)
    weights = torch.tensor([1.0, 0.25, 0.5, 0.0])

    weighted = _learner(_cfg(gamma=0.9)).learn(batch, weights)
    torch.testing.assert_close(weighted.metrics["loss"], (weights * per_item).mean(),
                               rtol=1e-6, atol=1e-6)
    # weights do not change the priorities: those are the unweighted |TD errors|
    torch.testing.assert_close(weighted.priorities, d.abs(), rtol=1e-6, atol=1e-6)
    # all-ones weights are the unweighted update, gradient step included
    ones, plain = _learner(_cfg(gamma=0.9)), _learner(_cfg(gamma=0.9))
    a = ones.learn(batch, torch.ones(4)).metrics
    b = plain.learn(batch).metrics
    torch.testing.assert_close(a["loss"], b["loss"])
    torch.testing.assert_close(a["grad_norm"], b["grad_norm"])
    assert _same(ones.q, plain.q)


def test_terminated_transitions_do_not_bootstrap():
    batch = _batch()
    batch["terminated"] = torch.ones(4, dtype=torch.bool)
    q_sa = _mlp(ONLINE, batch["obs"])[torch.arange(4), batch["action"]]
    out = _learner().learn(batch).metrics
    torch.testing.assert_close(out["loss"], _huber(q_sa - batch["reward"]))


def test_gamma_zero_regresses_on_the_reward():
    batch = _batch()
    q_sa = _mlp(ONLINE, batch["obs"])[torch.arange(4), batch["action"]]
    out = _learner(_cfg(gamma=0.0)).learn(batch).metrics
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
    out = learner.learn(batch).metrics

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
        learner.learn(_random_batch(i))
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
    learner.learn(_random_batch(99))
    assert _same(learner.target, snapshot)


def test_a_fresh_learner_starts_with_target_equal_to_online_and_frozen():
    learner = DQN(_cfg(), SPEC, seed=3)
    assert _same(learner.target, learner.q)
    assert not any(p.requires_grad for p in learner.target.parameters())
    again = DQN(_cfg(), SPEC, seed=3)
    assert _same(again.q, learner.q)


def test_policy_state_is_a_detached_copy():
    learner = _learner()
    state = learner.policy_state()
    assert set(state) == set(ONLINE)
    learner.learn(_batch())
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


def _part(chunk_index, rows, buffer: str = "replay", weights=None, key: str | None = None,
          item_ids=None, sequence_length: int | None = None) -> SamplePart:
    """A part as the learner receives it (parsed from a sample response)."""
    chunk_index = np.asarray(chunk_index)
    ids = np.arange(chunk_index.size).reshape(chunk_index.shape) if item_ids is None \
        else np.asarray(item_ids)
    return SamplePart.model_validate({
        "buffer": buffer, "key": key, "chunk_index": chunk_index.tolist(),
        "rows": np.asarray(rows).tolist(), "item_ids": ids.tolist(),
        "weights": None if weights is None else np.asarray(weights).tolist(),
        "sequence_length": sequence_length})


def test_assemble_picks_exactly_the_referenced_rows():
    chunks = [_chunk(k, n) for k, n in enumerate([5, 1, 12, 3])]
    chunk_index = np.array([[0, 2, 2, 3, 1], [3, 3, 0, 1, 2], [2, 2, 2, 2, 2]])
    rows = np.array([[4, 0, 11, 2, 0], [0, 0, 1, 0, 7], [3, 3, 5, 6, 10]])
    batches = assemble(chunks, [_part(chunk_index, rows)], 3)
    assert len(batches) == 3
    for b, batch in enumerate(batches):
        assert isinstance(batch, Batch) and len(batch) == 5
        assert set(batch.data) == set(DEFAULT_FIELDS)
        assert batch.weights is None and batch.item_refs == [] and batch.key is None
        for i in range(chunk_index.shape[1]):
            src = chunks[chunk_index[b, i]]
            for f in DEFAULT_FIELDS:
                np.testing.assert_array_equal(batch.data[f][i].numpy(), src[f][rows[b, i]],
                                              err_msg=f"batch {b} item {i} field {f}")
        assert batch.data["obs"].shape == (5, 2)
        assert batch.data["obs"].dtype == torch.float32
        assert batch.data["action"].dtype == torch.int64
        assert batch.data["terminated"].dtype == torch.bool
    expected_rewards = [[4, 2000, 2011, 3002, 1000],
                        [3000, 3000, 1, 1000, 2007],
                        [2003, 2003, 2005, 2006, 2010]]
    assert [b.data["reward"].tolist() for b in batches] == expected_rewards


def test_assemble_with_one_chunk_and_selected_fields():
    chunk = _chunk(7, 4)
    [batch] = assemble([chunk], [_part(np.zeros((1, 3), dtype=np.int64), [[3, 0, 3]])], 1,
                       fields=("reward", "truncated"))
    assert set(batch.data) == {"reward", "truncated"}
    assert batch.data["reward"].tolist() == [7003, 7000, 7003]


def test_assemble_out_of_range_row_is_an_error_not_a_wrong_row():
    chunks = [_chunk(0, 3), _chunk(1, 3)]
    with pytest.raises(IndexError):
        assemble(chunks, [_part([[1]], [[3]])], 1)


def test_assemble_concatenates_a_mix_part_by_part_with_their_weights_and_item_ids():
    """Two buffers' parts of one response: batch b is part 0's batch b, then part 1's; a
    uniform part has weight 1, and only a prioritized part's items are sent back."""
    chunks = [_chunk(k, 10) for k in range(3)]
    uniform = _part([[0, 1, 2], [2, 2, 2]], [[1, 2, 3], [4, 5, 6]], buffer="uni",
                    item_ids=[[10, 11, 12], [13, 14, 15]])
    prio = _part([[1, 0], [0, 0]], [[9, 8], [7, 6]], buffer="prio",
                 weights=[[0.5, 1.0], [0.25, 0.75]], item_ids=[[40, 41], [42, 43]])
    batches = assemble(chunks, [uniform, prio], 2)
    assert [b.data["reward"].tolist() for b in batches] == [
        [1, 1002, 2003, 1009, 8], [2004, 2005, 2006, 7, 6]]
    assert batches[0].weights.tolist() == [1.0, 1.0, 1.0, 0.5, 1.0]
    assert batches[1].weights.tolist() == [1.0, 1.0, 1.0, 0.25, 0.75]
    for b, batch in enumerate(batches):
        [(buffer, ids, where)] = batch.item_refs
        assert buffer == "prio" and where == slice(3, 5)
        assert ids.tolist() == [[40, 41], [42, 43]][b]
        # the slice is where those items sit in the batch
        assert batch.data["reward"][where].tolist() == [[1009, 8], [7, 6]][b]


def test_assemble_by_key_gives_one_batch_per_buffer():
    chunks = [_chunk(k, 10) for k in range(2)]
    parts = [_part([[0, 1]], [[1, 2]], buffer="a", key="a"),
             _part([[1, 1, 0]], [[3, 4, 5]], buffer="b", key="b", weights=[[1.0, 0.5, 0.5]])]
    [batch] = assemble(chunks, parts, 1, by_key=True)
    assert set(batch) == {"a", "b"}
    assert batch["a"].data["reward"].tolist() == [1, 1002]
    assert batch["b"].data["reward"].tolist() == [1003, 1004, 5]
    assert batch["a"].weights is None and batch["a"].item_refs == []
    assert batch["b"].weights.tolist() == [1.0, 0.5, 0.5]
    assert batch["b"].key == "b" and batch["b"].item_refs[0][0] == "b"


def test_assemble_reads_sequences_of_rows():
    chunks = [_chunk(k, 10) for k in range(2)]
    seq = _part([[0, 1]], [[2, 6]], sequence_length=3)
    [batch] = assemble(chunks, [seq], 1)
    assert batch.data["reward"].shape == (2, 3) and batch.data["obs"].shape == (2, 3, 2)
    assert batch.data["reward"].tolist() == [[2, 3, 4], [1006, 1007, 1008]]


def test_priority_feedback_sends_each_buffers_td_errors_for_its_items():
    chunks = [_chunk(0, 10)]
    parts = [_part([[0, 0]], [[1, 2]], buffer="uni", item_ids=[[1, 2]]),
             _part([[0, 0, 0]], [[3, 4, 5]], buffer="prio", weights=[[1.0, 1.0, 1.0]],
                   item_ids=[[7, 8, 9]])]
    [batch] = assemble(chunks, parts, 1)
    feedback = PriorityFeedback()
    feedback.add(batch, torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5]))
    feedback.add(batch, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    [update] = feedback.take()
    assert update.buffer == "prio"
    assert update.item_ids == [7, 8, 9, 7, 8, 9]
    np.testing.assert_allclose(update.priorities, [0.3, 0.4, 0.5, 3.0, 4.0, 5.0], rtol=1e-6)
    assert feedback.take() == []


def test_decoded_chunks_assemble_into_batches_the_learner_trains_on():
    blobs = [encode_arrays(_chunk(k, n), {"policy_version": "0"}) for k, n in [(0, 6), (1, 9)]]
    chunks = [decode_arrays(b)[0] for b in blobs]
    rng = np.random.default_rng(0)
    chunk_index = rng.integers(0, 2, (4, 8))
    rows = rng.integers(0, 6, (4, 8))
    batches = assemble(chunks, [_part(chunk_index, rows)], 4)
    learner = DQN(_cfg(), SPEC, seed=0)
    for batch in batches:
        # chunk values are large; scale them so the test only checks the plumbing
        data = {**batch.data, "obs": batch.data["obs"] / 1000,
                "next_obs": batch.data["next_obs"] / 1000, "reward": batch.data["reward"] / 1000}
        out = learner.learn(data, batch.weights)
        assert torch.isfinite(out.metrics["loss"])
        assert out.priorities.shape == (8,)
    assert learner.train_iterations == 4
