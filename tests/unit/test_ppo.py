"""shared/algos/ppo/policy.py: GAE by hand, the PPO losses by hand, acting, checkpoints, and
one learn round on a rollout from a real CartPole vector env."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.ppo import PPO, gae
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.contract.config import EnvConfig
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.envs.make import env_spec, make_vector_env
from rlfleet.shared.rollout.rollout import Rollout

CARTPOLE = env_spec(EnvConfig(id="CartPole-v1"))
PENDULUM = env_spec(EnvConfig(id="Pendulum-v1"))
TINY = EnvSpec(obs_shape=(2,), n_actions=3)


def _cfg(**kw) -> PPOConfig:
    base = dict(hidden_sizes=(4,), lr=0.01, epochs=1, batch_size=6, max_grad_norm=100.0)
    base.update(kw)
    return PPOConfig(**base)


# -- GAE ------------------------------------------------------------------------------------

# Six rows, three runs: rows 0-2 end in a termination; rows 3-4 end in a truncation whose
# final observation is worth 6; row 5 is cut by the chunk's end, its next observation worth 2.
# Row 2 carries a bootstrap value that must be ignored (it terminated), row 0 one that must
# be ignored too (not a cut row). gamma = lam = 0.5, so gamma * lam = 0.25.
GAE_EXAMPLE = {
    "reward":          [1.0, 2.0, 3.0, 1.0, 2.0, 4.0],
    "value":           [2.0, 4.0, 2.0, 8.0, 4.0, 2.0],
    "bootstrap_value": [7.0, 0.0, 9.0, 0.0, 6.0, 2.0],
    "terminated":      [False, False, True, False, False, False],
    "truncated":       [False, False, False, False, True, False],
    "cut":             [False, False, True, False, True, True],
}
# TD errors delta_t = r_t + 0.5 * next_value_t - v_t:
#   row 0: 1 + 0.5*4 - 2 =  1        (next value: row 1's)
#   row 1: 2 + 0.5*2 - 4 = -1        (next value: row 2's)
#   row 2: 3 + 0     - 2 =  1        (terminated: next value 0, bootstrap 9 ignored)
#   row 3: 1 + 0.5*4 - 8 = -5        (next value: row 4's)
#   row 4: 2 + 0.5*6 - 4 =  1        (truncated: the bootstrap value 6)
#   row 5: 4 + 0.5*2 - 2 =  3        (chunk end: the bootstrap value 2)
# advantages, backwards, carrying 0.25 * A_{t+1} only inside a run:
#   A5 = 3;  A4 = 1 (cut);  A3 = -5 + 0.25*1 = -4.75;  A2 = 1 (terminated);
#   A1 = -1 + 0.25*1 = -0.75;  A0 = 1 + 0.25*(-0.75) = 0.8125
GAE_ADVANTAGES = [0.8125, -0.75, 1.0, -4.75, 1.0, 3.0]
GAE_RETURNS = [2.8125, 3.25, 3.0, 3.25, 5.0, 5.0]  # advantages + values


def _gae_example(as_torch: bool = False) -> dict:
    conv = torch.tensor if as_torch else np.array
    return {k: conv(v) for k, v in GAE_EXAMPLE.items() if k != "truncated"}


@pytest.mark.parametrize("as_torch", [False, True])
def test_gae_by_hand(as_torch):
    ex = _gae_example(as_torch)
    adv, ret = gae(ex["reward"], ex["value"], ex["bootstrap_value"], ex["terminated"],
                   ex["cut"], gamma=0.5, lam=0.5)
    assert adv.dtype == ret.dtype == np.float32
    assert adv.tolist() == GAE_ADVANTAGES
    assert ret.tolist() == GAE_RETURNS


def test_gae_lambda_one_is_the_discounted_return_and_zero_the_td_error():
    ex = _gae_example()
    adv1, ret1 = gae(ex["reward"], ex["value"], ex["bootstrap_value"], ex["terminated"],
                     ex["cut"], gamma=0.5, lam=1.0)
    # Monte Carlo inside each run: row 0 = 1 + 0.5*2 + 0.25*3 = 2.75; row 3 = 1 + 0.5*(2 +
    # 0.5*6) = 3.5; cut rows bootstrap
    assert ret1.tolist() == [2.75, 3.5, 3.0, 3.5, 5.0, 5.0]
    adv0, _ = gae(ex["reward"], ex["value"], ex["bootstrap_value"], ex["terminated"],
                  ex["cut"], gamma=0.5, lam=0.0)
    assert adv0.tolist() == [1.0, -1.0, 1.0, -5.0, 1.0, 3.0]


def _gae_reference(r, v, boot, term, cut, gamma, lam):
    """Run by run, each written out from its own end: the definition, slowly."""
    adv = np.zeros(len(r))
    start = 0
    for end in np.flatnonzero(cut):
        nxt = 0.0
        for t in range(end, start - 1, -1):
            if t == end:
                next_v, nxt = (0.0 if term[t] else boot[t]), 0.0
            else:
                next_v = 0.0 if term[t] else v[t + 1]
            carry = 0.0 if term[t] else nxt
            nxt = r[t] + gamma * next_v - v[t] + gamma * lam * carry
            adv[t] = nxt
        start = end + 1
    return adv


def test_gae_matches_a_run_by_run_reference_on_random_rows():
    rng = np.random.default_rng(0)
    n = 3000
    r, v, boot = (rng.normal(size=n).astype(np.float32) for _ in range(3))
    term = rng.random(n) < 0.02
    cut = term | (rng.random(n) < 0.03)
    cut[-1] = True
    boot[term | ~cut] = 0.0
    adv, ret = gae(r, v, boot, term, cut, 0.97, 0.9)
    ref = _gae_reference(r, v, boot, term, cut, 0.97, 0.9)
    np.testing.assert_allclose(adv, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ret, ref + v, rtol=1e-4, atol=1e-5)


def test_gae_needs_the_last_row_to_be_cut():
    ex = _gae_example()
    ex["cut"][-1] = False
    with pytest.raises(ValueError, match="last row"):
        gae(ex["reward"], ex["value"], ex["bootstrap_value"], ex["terminated"], ex["cut"],
            0.5, 0.5)


# -- losses by hand -------------------------------------------------------------------------

def _tanh_mlp(state: dict[str, torch.Tensor], prefix: str, x: torch.Tensor) -> torch.Tensor:
    """One hidden Tanh layer, written out."""
    h = torch.tanh(x @ state[f"{prefix}.0.weight"].T + state[f"{prefix}.0.bias"])
    return h @ state[f"{prefix}.2.weight"].T + state[f"{prefix}.2.bias"]


OBS = torch.tensor([[0.5, -1.0], [1.0, 2.0], [-0.3, 0.8], [2.0, 0.1], [-1.5, -0.5],
                    [0.0, 1.0]])
ACTIONS = torch.tensor([0, 2, 1, 1, 0, 2])
# Collector ratios pi_new / pi_old per row. The normalised advantages have signs
# + - + - + + (see _hand_losses), so with clip 0.2: row 0 (A>0, 1.5) and row 5 (A>0, 1.25) are
# clipped at 1.2, row 1 (A<0, 0.6) at 0.8; rows 2 (A>0, 0.6) and 3 (A<0, 1.5) fall outside
# the range on the side where the unclipped term is the pessimistic one; row 4 is inside.
RATIOS = torch.tensor([1.5, 0.6, 0.6, 1.5, 1.1, 1.25])


def _hand_batch(ppo: PPO, reward_scale: float) -> tuple[dict[str, torch.Tensor], dict]:
    """The GAE example as a rollout (rewards divided by `reward_scale`, so scaling gives back
    the example), with old log-probs that make the ratios RATIOS; and the quantities a hand
    computation needs."""
    state = ppo.policy_state()
    logp_all = torch.log_softmax(_tanh_mlp(state, "actor", OBS), dim=1)
    logp = logp_all[torch.arange(6), ACTIONS]
    ex = {k: torch.tensor(v) for k, v in GAE_EXAMPLE.items()}
    batch = {"obs": OBS, "action": ACTIONS, "reward": ex["reward"] / reward_scale,
             "next_obs": OBS + 1.0, "terminated": ex["terminated"],
             "truncated": ex["truncated"], "cut": ex["cut"],
             "log_prob": logp - torch.log(RATIOS), "value": ex["value"],
             "bootstrap_value": ex["bootstrap_value"]}
    hand = {"logp_all": logp_all, "value_new": _tanh_mlp(state, "critic", OBS).squeeze(1)}
    return batch, hand


def _hand_losses(ppo: PPO, reward_scale: float = 1.0) -> tuple[dict, dict]:
    """The expected metrics of one update with gamma = lam = 0.5, written out."""
    batch, hand = _hand_batch(ppo, reward_scale)
    adv = torch.tensor(GAE_ADVANTAGES)
    norm = (adv - adv.mean()) / (adv.std() + 1e-8)
    assert (norm > 0).tolist() == [True, False, True, False, True, True]
    # max(-A r, -A clip(r)) per row, the chosen side written out
    per_row = torch.stack([-norm[0] * 1.2, -norm[1] * 0.8, -norm[2] * 0.6,
                           -norm[3] * 1.5, -norm[4] * 1.1, -norm[5] * 1.2])
    p = hand["logp_all"].exp()
    value_err = hand["value_new"] - torch.tensor(GAE_RETURNS)
    r = RATIOS
    expected = {
        "policy_loss": per_row.mean(),
        "value_loss": 0.5 * (value_err ** 2).mean(),
        "entropy": -(p * hand["logp_all"]).sum(dim=1).mean(),
        "approx_kl": ((r - 1) - torch.log(r)).mean(),
        "clip_frac": torch.tensor(5 / 6),
        "value_mean": torch.tensor(GAE_EXAMPLE["value"]).mean(),
    }
    return batch, expected


@pytest.mark.parametrize("reward_scale", [1.0, 0.25])
def test_one_update_reports_the_hand_computed_losses(reward_scale):
    ppo = PPO(_cfg(gamma=0.5, gae_lambda=0.5, reward_scale=reward_scale), TINY, seed=3)
    batch, expected = _hand_losses(ppo, reward_scale)
    before = ppo.policy_state()

    out = ppo.learn(batch)

    m = out.metrics
    for key, value in expected.items():
        torch.testing.assert_close(torch.as_tensor(m[key]), value, rtol=1e-5, atol=1e-6,
                                   msg=key)
    assert m["rollout_rows"] == 6
    assert out.priorities is None
    assert ppo.train_iterations == 1
    assert all(torch.isfinite(torch.as_tensor(v)) for v in m.values())
    assert not all(torch.equal(before[k], v) for k, v in ppo.policy_state().items())


def test_the_loss_is_what_is_minimised_one_clipped_adam_step_on_the_hand_loss():
    cfg = _cfg(gamma=0.5, gae_lambda=0.5, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.3)
    ppo = PPO(cfg, TINY, seed=4)
    batch, _ = _hand_batch(ppo, 1.0)
    params = {k: v.clone().requires_grad_(True) for k, v in ppo.policy_state().items()}
    logp_all = torch.log_softmax(_tanh_mlp(params, "actor", OBS), dim=1)
    ratio = (logp_all[torch.arange(6), ACTIONS] - batch["log_prob"]).exp()
    adv = torch.tensor(GAE_ADVANTAGES)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
    v = _tanh_mlp(params, "critic", OBS).squeeze(1)
    vl = 0.5 * ((v - torch.tensor(GAE_RETURNS)) ** 2).mean()
    ent = -(logp_all.exp() * logp_all).sum(dim=1).mean()
    (pg - 0.01 * ent + 0.5 * vl).backward()
    norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params.values()))
    assert norm > cfg.max_grad_norm  # so clipping matters
    scale = cfg.max_grad_norm / (norm + 1e-6)

    out = ppo.learn(batch)

    torch.testing.assert_close(out.metrics["grad_norm"], norm, rtol=1e-5, atol=1e-6)
    for name, new in ppo.policy_state().items():
        g = params[name].grad * scale  # Adam's first step: lr * g / (|g| + eps), eps = 1e-5
        expected = params[name].detach() - cfg.lr * g / (g.abs() + 1e-5)
        torch.testing.assert_close(new, expected, rtol=1e-5, atol=1e-6, msg=name)


def test_clipped_value_loss_keeps_the_worse_of_the_two_errors():
    ppo = PPO(_cfg(gamma=0.5, gae_lambda=0.5, clip_vloss=True, clip_coef=0.2), TINY, seed=3)
    batch, hand = _hand_batch(ppo, 1.0)
    old, ret = batch["value"], torch.tensor(GAE_RETURNS)
    new = hand["value_new"]
    clipped = old + (new - old).clamp(-0.2, 0.2)
    unclipped_err, clipped_err = (new - ret) ** 2, (clipped - ret) ** 2
    # both branches are taken somewhere in this batch
    assert (clipped_err > unclipped_err).any() and (clipped_err < unclipped_err).any()
    expected = 0.5 * torch.max(unclipped_err, clipped_err).mean()
    assert not torch.isclose(expected, 0.5 * unclipped_err.mean())

    out = ppo.learn(batch)
    torch.testing.assert_close(out.metrics["value_loss"], expected, rtol=1e-5, atol=1e-6)


def test_gaussian_log_prob_and_entropy_by_hand():
    ppo = PPO(_cfg(init_log_std=-0.5, batch_size=64), PENDULUM, seed=0)
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    out = ppo.act(obs, 0)
    state = ppo.policy_state()
    mean = _tanh_mlp(state, "actor", torch.from_numpy(obs))
    assert torch.equal(state["log_std"], torch.full((1,), -0.5))
    std = math.exp(-0.5)
    z = (torch.from_numpy(out.actions) - mean) / std
    hand = (-0.5 * z ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)).sum(dim=1)
    torch.testing.assert_close(torch.from_numpy(out.extras["log_prob"]), hand, rtol=1e-5,
                               atol=1e-5)
    # the entropy of a Gaussian does not depend on the mean: sum of log std + 1/2 log(2 pi e)
    rows = 5
    batch = {"obs": torch.from_numpy(obs), "action": torch.from_numpy(out.actions),
             "reward": torch.ones(rows), "next_obs": torch.from_numpy(obs),
             "terminated": torch.zeros(rows, dtype=torch.bool),
             "truncated": torch.zeros(rows, dtype=torch.bool),
             "cut": torch.tensor([False] * 4 + [True]),
             "log_prob": torch.from_numpy(out.extras["log_prob"]),
             "value": torch.from_numpy(out.extras["value"]),
             "bootstrap_value": torch.zeros(rows)}
    m = ppo.learn(batch).metrics
    hand_entropy = -0.5 + 0.5 * math.log(2 * math.pi * math.e)
    torch.testing.assert_close(m["entropy"], torch.tensor(hand_entropy))
    # the collector's log-probs are this policy's: every ratio is 1 on the first minibatch
    torch.testing.assert_close(m["approx_kl"], torch.tensor(0.0), atol=1e-6, rtol=0)
    assert m["clip_frac"] == 0


def test_importance_weights_are_refused():
    ppo = PPO(_cfg(gamma=0.5, gae_lambda=0.5), TINY, seed=3)
    batch, _ = _hand_batch(ppo, 1.0)
    with pytest.raises(ValueError, match="on-policy"):
        ppo.learn(batch, torch.ones(6))


def test_minibatches_cover_every_row_and_count_gradient_steps():
    ppo = PPO(_cfg(epochs=3, batch_size=4), CARTPOLE, seed=0)
    rows = 14  # 14 // 4 = 3 minibatches of 4-5 rows per epoch: 9 gradient steps
    g = torch.Generator().manual_seed(0)
    cut = torch.zeros(rows, dtype=torch.bool)
    cut[[6, 13]] = True
    batch = {"obs": torch.randn(rows, 4, generator=g),
             "action": torch.randint(0, 2, (rows,), generator=g),
             "reward": torch.ones(rows), "terminated": cut.clone(), "cut": cut,
             "log_prob": torch.full((rows,), math.log(0.5)), "value": torch.zeros(rows),
             "bootstrap_value": torch.zeros(rows)}
    ppo.learn(batch)
    assert ppo.train_iterations == 9
    small = PPO(_cfg(epochs=2, batch_size=64), CARTPOLE, seed=0)
    small.learn(batch)  # fewer rows than a minibatch: one minibatch of all of them per epoch
    assert small.train_iterations == 2


# -- acting ---------------------------------------------------------------------------------

def test_discrete_acting_shapes_dtypes_and_log_probs():
    ppo = PPO(PPOConfig(), CARTPOLE, seed=0)
    assert isinstance(ppo, Policy) and ppo.on_policy and ppo.version == -1
    obs = np.random.default_rng(1).normal(size=(7, 4))  # float64, as some envs give
    out = ppo.act(obs, env_step=123)
    assert out.actions.dtype == np.int64 and out.actions.shape == (7,)
    assert set(out.actions.tolist()) <= {0, 1}
    assert set(out.extras) == {"log_prob", "value"}
    for v in out.extras.values():
        assert v.dtype == np.float32 and v.shape == (7,)
    state = ppo.policy_state()
    x = torch.as_tensor(obs, dtype=torch.float32)
    logp = torch.log_softmax(_tanh_mlp_2(state, "actor", x), dim=1)
    np.testing.assert_allclose(out.extras["log_prob"],
                               logp[torch.arange(7), torch.from_numpy(out.actions)].numpy(),
                               rtol=1e-5, atol=1e-6)
    values = _tanh_mlp_2(state, "critic", x).squeeze(1).numpy()
    np.testing.assert_allclose(out.extras["value"], values, rtol=1e-5, atol=1e-6)
    boot = ppo.bootstrap(obs)
    assert boot.dtype == np.float32 and boot.shape == (7,)
    np.testing.assert_allclose(boot, values, rtol=1e-5, atol=1e-6)

    greedy = ppo.act_eval(obs)
    assert greedy.dtype == np.int64 and greedy.shape == (7,)
    assert np.array_equal(greedy, logp.argmax(dim=1).numpy())
    assert np.array_equal(greedy, ppo.act_eval(obs, deterministic=True))
    sampled = ppo.act_eval(obs, deterministic=False)
    assert sampled.dtype == np.int64 and sampled.shape == (7,)


def _tanh_mlp_2(state: dict[str, torch.Tensor], prefix: str, x: torch.Tensor) -> torch.Tensor:
    """Two hidden Tanh layers (the default 64-64 nets), written out."""
    h = torch.tanh(x @ state[f"{prefix}.0.weight"].T + state[f"{prefix}.0.bias"])
    h = torch.tanh(h @ state[f"{prefix}.2.weight"].T + state[f"{prefix}.2.bias"])
    return h @ state[f"{prefix}.4.weight"].T + state[f"{prefix}.4.bias"]


@pytest.mark.parametrize("spec", [PENDULUM, EnvSpec(obs_shape=(3, 2), action_shape=(2,),
                                                    action_low=(-1, -1), action_high=(1, 1))])
def test_continuous_acting_shapes_dtypes_and_deterministic_mean(spec):
    ppo = PPO(PPOConfig(init_log_std=0.0), spec, seed=0)
    obs = np.random.default_rng(2).normal(size=(50, *spec.obs_shape)).astype(np.float32)
    out = ppo.act(obs, env_step=0)
    assert out.actions.dtype == np.float32 and out.actions.shape == (50, *spec.action_shape)
    assert out.extras["log_prob"].dtype == out.extras["value"].dtype == np.float32
    assert out.extras["log_prob"].shape == out.extras["value"].shape == (50,)
    assert ppo.bootstrap(obs).shape == (50,) and ppo.bootstrap(obs).dtype == np.float32
    state = ppo.policy_state()
    assert torch.equal(state["log_std"], torch.zeros(int(np.prod(spec.action_shape))))

    mean = ppo.act_eval(obs)
    assert mean.dtype == np.float32 and mean.shape == (50, *spec.action_shape)
    hand_mean = _tanh_mlp_2(state, "actor", torch.from_numpy(obs).flatten(1))
    np.testing.assert_allclose(mean.reshape(50, -1), hand_mean.numpy(), rtol=1e-5, atol=1e-6)
    assert np.array_equal(mean, ppo.act_eval(obs, deterministic=True))
    sampled = ppo.act_eval(obs, deterministic=False)
    assert sampled.shape == mean.shape and not np.allclose(sampled, mean)
    # not squashed: with std 1 around a near-zero mean, some samples leave [-1, 1]
    assert (np.abs(out.actions) > 1).any()


def test_same_seed_same_actions():
    obs = np.random.default_rng(3).normal(size=(20, 3)).astype(np.float32)
    a, b = PPO(PPOConfig(), PENDULUM, seed=7), PPO(PPOConfig(), PENDULUM, seed=7)
    torch.rand(5)  # other users of torch's global generator do not change the samples
    assert np.array_equal(a.act(obs, 0).actions, b.act(obs, 0).actions)


# -- checkpoints ----------------------------------------------------------------------------

def _random_rollout(spec: EnvSpec, ppo: PPO, rows: int, seed: int) -> dict[str, torch.Tensor]:
    obs = np.random.default_rng(seed).normal(size=(rows, *spec.obs_shape)).astype(np.float32)
    out = ppo.act(obs, 0)
    cut = np.zeros(rows, dtype=bool)
    cut[rows // 2 - 1] = cut[-1] = True
    return {"obs": torch.from_numpy(obs), "action": torch.from_numpy(out.actions),
            "reward": torch.from_numpy(np.random.default_rng(seed + 1).normal(size=rows)
                                       .astype(np.float32)),
            "terminated": torch.zeros(rows, dtype=torch.bool), "cut": torch.from_numpy(cut),
            "log_prob": torch.from_numpy(out.extras["log_prob"]),
            "value": torch.from_numpy(out.extras["value"]),
            "bootstrap_value": torch.from_numpy(np.where(cut, 0.5, 0.0).astype(np.float32))}


@pytest.mark.parametrize("spec", [CARTPOLE, PENDULUM])
def test_state_dict_round_trip_through_safetensors_restores_outputs_and_optimizer(spec):
    cfg = PPOConfig(batch_size=16, epochs=2)
    ppo = PPO(cfg, spec, seed=0)
    ppo.learn(_random_rollout(spec, ppo, 32, 0))
    state = ppo.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    assert any(k.startswith("optim.") for k in state)
    restored_state = st_load(st_save(state))  # a checkpoint is plain safetensors

    other = PPO(cfg, spec, seed=99)
    other.load_state_dict(restored_state)
    assert other.train_iterations == ppo.train_iterations == 4
    obs = np.random.default_rng(5).normal(size=(9, *spec.obs_shape)).astype(np.float32)
    assert np.array_equal(other.act_eval(obs), ppo.act_eval(obs))
    assert np.array_equal(other.bootstrap(obs), ppo.bootstrap(obs))
    a, b = ppo.optimizer.state_dict()["state"], other.optimizer.state_dict()["state"]
    assert a.keys() == b.keys()
    for idx in a:
        for key in a[idx]:
            assert torch.equal(torch.as_tensor(a[idx][key]), torch.as_tensor(b[idx][key]))

    # and both continue identically: one full-batch step from the same state (the rollout is
    # acted by a third policy: acting draws from the acting policy's generator)
    batch = _random_rollout(spec, PPO(cfg, spec, seed=7), 16, 1)
    ppo.learn(batch)
    other.learn(batch)
    for k, v in ppo.state_dict().items():
        torch.testing.assert_close(other.state_dict()[k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_the_learning_rate_anneals_by_rows_learned_and_resumes_from_a_checkpoint():
    spec = CARTPOLE
    cfg = PPOConfig(batch_size=16, epochs=1, lr=0.01, lr_anneal_rows=96)
    ppo = PPO(cfg, spec, seed=0)
    rates = []
    for i in range(4):  # rollouts of 32 rows: 0/96, 32/96, 64/96 and 96/96 learned before
        ppo.learn(_random_rollout(spec, ppo, 32, i))
        rates.append(ppo.optimizer.param_groups[0]["lr"])
    assert rates == pytest.approx([0.01, 0.01 * 2 / 3, 0.01 / 3, 0.0])
    assert ppo.rows_learned == 128
    # at 0 it stays 0: the parameters no longer move
    before = {k: v.clone() for k, v in ppo.policy_state().items()}
    ppo.learn(_random_rollout(spec, ppo, 32, 9))
    for k, v in ppo.policy_state().items():
        assert torch.equal(v, before[k]), k

    half = PPO(cfg, spec, seed=0)
    half.learn(_random_rollout(spec, half, 48, 0))
    resumed = PPO(cfg, spec, seed=1)
    resumed.load_state_dict(st_load(st_save(half.state_dict())))
    assert resumed.rows_learned == 48
    resumed.learn(_random_rollout(spec, resumed, 16, 1))
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5)
    # an earlier version's checkpoint, without the annealing count, counts from 0
    old = {k: v for k, v in half.state_dict().items() if k != "rows_learned"}
    resumed.load_state_dict(old)
    assert resumed.rows_learned == 0
    assert PPO(PPOConfig(), spec).cfg.lr_anneal_rows is None  # constant unless asked


def test_policy_state_is_a_detached_copy_that_load_policy_adopts():
    ppo = PPO(PPOConfig(batch_size=16), PENDULUM, seed=0)
    state = ppo.policy_state()
    assert set(state) == {"log_std", *(f"{n}.{i}.{p}" for n in ("actor", "critic")
                                       for i in (0, 2, 4) for p in ("weight", "bias"))}
    assert not any(v.requires_grad for v in state.values())
    ppo.learn(_random_rollout(PENDULUM, ppo, 32, 0))
    assert not all(torch.equal(state[k], v) for k, v in ppo.policy_state().items())

    actor = PPO(PPOConfig(), PENDULUM, seed=5)
    actor.load_policy(3, ppo.policy_state())
    assert actor.version == 3
    obs = np.random.default_rng(5).normal(size=(9, 3)).astype(np.float32)
    assert np.array_equal(actor.act_eval(obs), ppo.act_eval(obs))
    assert np.array_equal(actor.bootstrap(obs), ppo.bootstrap(obs))


# -- the real data path ---------------------------------------------------------------------

def test_learn_on_chunks_from_a_real_cartpole_rollout():
    cfg = PPOConfig(rollout_size=256, batch_size=64, epochs=2)
    env_cfg = EnvConfig(id="CartPole-v1", num_envs=4)
    ppo = make_policy(cfg, CARTPOLE, seed=0)
    assert isinstance(ppo, PPO)
    ppo.load_policy(0, ppo.policy_state())
    envs = make_vector_env(env_cfg, env_cfg.num_envs, seed=0)
    try:
        rollout = Rollout(envs, ppo, chunk_size=64, mode="samples")
        chunks, rows = [], 0
        while rows < cfg.rollout_size:
            chunks.append(rollout.collect(rows))
            rows += chunks[-1].length
    finally:
        envs.close()
    fields = set(chunks[0].arrays)
    assert {"log_prob", "value", "bootstrap_value", "cut"} <= fields
    batch = {k: torch.from_numpy(np.concatenate([c.arrays[k] for c in chunks])) for k in fields}
    assert batch["terminated"].any()  # random CartPole episodes end within 64 steps
    before = ppo.policy_state()

    out = ppo.learn(batch)

    assert ppo.train_iterations == 2 * (rows // 64)
    assert out.metrics["rollout_rows"] == rows
    assert all(math.isfinite(float(v)) for v in out.metrics.values())
    after = ppo.policy_state()
    for name in ("actor.0.weight", "actor.4.weight", "critic.0.weight", "critic.4.bias"):
        assert not torch.equal(before[name], after[name]), name
    ppo.load_policy(1, after)
    assert ppo.version == 1
