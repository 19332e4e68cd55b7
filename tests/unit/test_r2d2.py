"""R2D2's pieces against what they must be: value rescaling and its inverse, n-step targets
inside a sequence, burn-in without gradient, padding that never reaches the loss, the
state the collector stores (it reproduces the network's own hidden state, across chunk
boundaries, and is zero at every episode's start), and evaluation's own memory."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import yaml

from rlfleet.shared.algos.capabilities import Recurrent, capabilities_of
from rlfleet.shared.algos.r2d2 import (
    R2D2,
    SPEC,
    R2D2Config,
    n_step_targets,
    rescale,
    unrescale,
)
from rlfleet.shared.contract.config import EnvConfig
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.envs.make import make_vector_env
from rlfleet.shared.rollout.rollout import Rollout, evaluate
from rlfleet.shared.run.config import parse_config

from .helpers import REPO

NOVEL = EnvSpec(obs_shape=(2,), n_actions=2)


def sequences(B: int = 6, L: int = 10, seed: int = 0, lstm: int = 8,
              cuts: dict[int, int] | None = None) -> dict[str, torch.Tensor]:
    """B sequences of L rows; `cuts` {sequence: row} ends that sequence's run at the row."""
    g = torch.Generator().manual_seed(seed)
    cut = torch.zeros(B, L, dtype=torch.bool)
    for b, row in (cuts or {}).items():
        cut[b, row] = True
    return {"obs": torch.randn(B, L, 2, generator=g),
            "next_obs": torch.randn(B, L, 2, generator=g),
            "action": torch.randint(0, 2, (B, L), generator=g),
            "reward": torch.rand(B, L, generator=g),
            "terminated": torch.zeros(B, L, dtype=torch.bool),
            "cut": cut,
            "recurrent_h": torch.randn(B, L, lstm, generator=g) * 0.1,
            "recurrent_c": torch.randn(B, L, lstm, generator=g) * 0.1}


def policy(**kw) -> R2D2:
    return R2D2(R2D2Config(lstm_size=8, hidden_sizes=(16,), **kw), NOVEL, seed=3)


def test_value_rescaling_and_its_inverse():
    x = torch.linspace(-1000, 1000, 20001, dtype=torch.float64)
    eps = 1e-3
    torch.testing.assert_close(unrescale(rescale(x, eps), eps), x, rtol=1e-9, atol=1e-7)
    torch.testing.assert_close(rescale(unrescale(x / 50, eps), eps), x / 50, rtol=1e-9,
                               atol=1e-9)
    # by hand: h(3) = sqrt(4) - 1 + 0.003 = 1.003; h is odd and h(0) = 0
    assert rescale(torch.tensor(3.0, dtype=torch.float64), eps).item() == pytest.approx(1.003)
    assert rescale(torch.tensor(-3.0), eps).item() == pytest.approx(-1.003)
    assert rescale(torch.tensor(0.0), eps).item() == 0.0


def test_n_step_targets_stop_at_cuts_terminals_and_the_sequence_end():
    g = 0.9
    reward = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    boot = torch.tensor([[10.0, 20.0, 30.0, 40.0, 50.0]])  # V(next_obs_t)
    terminated = torch.tensor([[False, False, False, False, False]])
    cut = torch.tensor([[False, False, True, False, False]])  # a time limit at row 2
    got = n_step_targets(reward, terminated, cut, boot, g, n=2)
    want = [1 + g * 2 + g * g * 20,   # rows 0, 1, bootstrapped from next_obs_1
            2 + g * 3 + g * g * 30,   # rows 1, 2: row 2 is cut, bootstraps
            3 + g * 30,               # row 2 alone: its run ends there
            4 + g * 5 + g * g * 50,   # rows 3, 4
            5 + g * 50]               # the sequence ends: one step
    torch.testing.assert_close(got, torch.tensor([want]))
    terminated = torch.tensor([[False, True, False, False, False]])
    got = n_step_targets(reward, terminated, torch.zeros_like(cut), boot, g, n=3)
    assert got[0, 0].item() == pytest.approx(1 + g * 2)  # terminal: no bootstrap
    assert got[0, 1].item() == pytest.approx(2.0)


def test_burn_in_rows_give_no_gradient():
    p = policy(burn_in=4)
    batch = sequences()
    batch["obs"].requires_grad_(True)
    batch["next_obs"].requires_grad_(True)
    p.learn(batch)
    # inputs are obs[0], next_obs[0..L-1]: the first burn_in of them only warm the state up
    assert batch["obs"].grad is None or not batch["obs"].grad.any()
    assert not batch["next_obs"].grad[:, :3].any()
    assert batch["next_obs"].grad[:, 3:-1].abs().sum(dim=(0, 2)).gt(0).all()
    # the last row's next_obs is only bootstrapped from: no gradient either
    assert not batch["next_obs"].grad[:, -1].any()


def test_burn_in_warms_the_state_the_loss_starts_from():
    """Changing only burn-in rows changes the loss (the state carries them), not its
    gradient path."""
    a, b = policy(burn_in=4), policy(burn_in=4)
    batch = sequences()
    other = {k: v.clone() for k, v in batch.items()}
    other["obs"][:, 0] += 1.0
    assert a.learn(batch).metrics["loss"] != b.learn(other).metrics["loss"]


def test_padded_rows_after_a_cut_never_reach_the_loss_or_the_priorities():
    a = policy(burn_in=2)
    b = copy.deepcopy(a)
    batch = sequences(cuts={0: 5, 3: 2})
    garbage = {k: v.clone() for k, v in batch.items()}
    for seq, row in ((0, 5), (3, 2)):
        for key in ("obs", "next_obs", "reward", "recurrent_h", "recurrent_c"):
            if key.startswith("recurrent"):
                continue  # only the first row's state is read
            garbage[key][seq, row + 1:] = torch.randn_like(garbage[key][seq, row + 1:]) * 9
        garbage["action"][seq, row + 1:] = 1 - garbage["action"][seq, row + 1:]
        garbage["terminated"][seq, row + 1:] = True
    out_a, out_b = a.learn(batch), b.learn(garbage)
    torch.testing.assert_close(out_a.metrics["loss"], out_b.metrics["loss"])
    torch.testing.assert_close(out_a.priorities, out_b.priorities)
    for key, value in a.state_dict().items():
        torch.testing.assert_close(value, b.state_dict()[key], msg=key)


def test_priorities_mix_max_and_mean_td_error_per_sequence_and_weights_scale_each():
    p = policy(priority_eta=1.0, n_step=1)
    mean_only = copy.deepcopy(p)
    mean_only.cfg = mean_only.cfg.model_copy(update={"priority_eta": 0.0})
    batch = sequences(B=4)
    high, low = p.learn(batch).priorities, mean_only.learn(batch).priorities
    assert high.shape == (4,) and low.shape == (4,)
    assert (high >= low - 1e-6).all() and (high > low).any()  # max >= mean
    # importance weights multiply each sequence's mean loss
    a, b = policy(), policy()
    alone = a.learn({k: v[:1] for k, v in batch.items()}).metrics["loss"]
    weighted = b.learn(batch, torch.tensor([2.0, 0.0, 0.0, 0.0])).metrics["loss"]
    torch.testing.assert_close(weighted, alone * 2 / 4)


def stored_rollout(chunk_size: int, chunks: int, seed: int = 0):
    env = EnvConfig(id="rlfleet/CartPoleNoVel-v0", num_envs=3)
    envs = make_vector_env(env, 3, seed)
    p = policy(eps_start=0.3, eps_end=0.3)
    rollout = Rollout(envs, p, chunk_size=chunk_size)
    out = [rollout.collect(0) for _ in range(chunks)]
    envs.close()
    return p, out


def test_the_stored_state_is_the_network_s_own_across_chunks_and_zero_at_episode_starts():
    p, chunks = stored_rollout(chunk_size=3 * 40, chunks=3)
    T = 40
    # each env's rows of the three chunks, one after another in time
    for env in range(3):
        rows = {k: np.concatenate([c.arrays[k][env * T:(env + 1) * T] for c in chunks])
                for k in ("obs", "next_obs", "terminated", "truncated", "recurrent_h",
                          "recurrent_c")}
        done = rows["terminated"] | rows["truncated"]
        assert done.any(), "CartPole episodes this short policy plays end within 120 steps"
        state = (torch.from_numpy(rows["recurrent_h"][:1]),
                 torch.from_numpy(rows["recurrent_c"][:1]))
        assert not state[0].any()  # the first episode starts from zeros
        for t in range(len(done) - 1):
            with torch.no_grad():
                _, after = p.q(torch.from_numpy(rows["obs"][t:t + 1]).unsqueeze(1), state)
            want = (torch.zeros_like(after[0]), torch.zeros_like(after[1])) if done[t] else after
            got = (torch.from_numpy(rows["recurrent_h"][t + 1:t + 2]),
                   torch.from_numpy(rows["recurrent_c"][t + 1:t + 2]))
            torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
            state = got


def test_evaluation_keeps_a_memory_of_its_own():
    p, _ = stored_rollout(chunk_size=30, chunks=1)
    acting = tuple(s.clone() for s in p._states[False])
    envs = make_vector_env(EnvConfig(id="rlfleet/CartPoleNoVel-v0", num_envs=2), 2, 5)
    first = evaluate(envs, p, 2, seed=5)
    second = evaluate(envs, p, 2, seed=5)
    envs.close()
    assert first.returns == second.returns  # each evaluation starts from an empty memory
    for before, after in zip(acting, p._states[False], strict=True):
        assert torch.equal(before, after)  # the collecting envs' memories are untouched


def test_r2d2_is_recurrent_and_its_checkpoint_round_trips():
    p = policy()
    assert Recurrent in capabilities_of(p)
    p.learn(sequences())
    q = policy()
    q.load_state_dict(p.state_dict())
    for key, value in p.state_dict().items():
        torch.testing.assert_close(q.state_dict()[key], value, msg=key)
    assert q.train_iterations == 1


def test_the_env_hides_the_velocities():
    envs = make_vector_env(EnvConfig(id="rlfleet/CartPoleNoVel-v0", num_envs=1), 1, 0)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (1, 2)
    import gymnasium as gym

    full = gym.make("CartPole-v1")
    ref, _ = full.reset(seed=0)
    np.testing.assert_allclose(obs[0], ref[[0, 2]])
    assert gym.spec("rlfleet/CartPoleNoVel-v0").max_episode_steps == 500
    envs.close()


def test_the_launch_check_names_what_r2d2_cannot_take():
    data = yaml.safe_load((REPO / "configs" / "cartpolenovel-r2d2.yaml").read_text())
    SPEC.check_env(parse_config(data), NOVEL)  # as shipped: fine
    data["algo"]["burn_in"] = 16
    with pytest.raises(ValueError, match="algo.burn_in=16 leaves no row of "
                       "buffers.replay.sequence_length=16"):
        SPEC.check_env(parse_config(data), NOVEL)
    data["algo"]["burn_in"] = 4
    data["algo"]["reward_model"] = "rnd"
    with pytest.raises(ValueError, match="algo.reward_model"):
        SPEC.check_env(parse_config(data), NOVEL)
    with pytest.raises(ValueError, match="flat observations"):
        SPEC.check_env(parse_config({**data, "algo": {"name": "r2d2"}}),
                       EnvSpec(obs_shape=(4, 84, 84), n_actions=2))
