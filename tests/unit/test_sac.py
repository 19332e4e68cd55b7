"""SAC's pieces against what they must be: the squashed Gaussian's log-probability (against
torch's own change of variables), the critic, actor and temperature losses (against the
formulas written out here), the temperature's direction, actions in the env's bounds, PER
weights and n-step discounts where they belong, observation normalisation, a reward model,
and a checkpoint that carries the learning noise's stream."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from rlfleet.shared.algos.capabilities import NormalizesObservations, capabilities_of
from rlfleet.shared.algos.reward_model import WithRewardModel, with_reward_model
from rlfleet.shared.algos.sac import SAC, SACConfig, squash, squashed_log_prob
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.util.moments import RunningMoments

PENDULUM = EnvSpec(obs_shape=(3,), action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
TWO = EnvSpec(obs_shape=(4,), action_shape=(2,), action_low=(-1.0, 0.0),
              action_high=(1.0, 3.0))


def policy(spec: EnvSpec = TWO, **kw) -> SAC:
    return SAC(SACConfig(hidden_sizes=(8,), **kw), spec, seed=1)


def batch_of(spec: EnvSpec, n: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
    return {"obs": torch.randn(n, *spec.obs_shape, generator=g),
            "next_obs": torch.randn(n, *spec.obs_shape, generator=g),
            "action": low + (high - low) * torch.rand(n, len(low), generator=g),
            "reward": torch.randn(n, generator=g),
            "terminated": torch.rand(n, generator=g) < 0.2}


def test_the_squashed_log_prob_is_the_change_of_variables():
    g = torch.Generator().manual_seed(0)
    mean, log_std = torch.randn(500, 3, generator=g), torch.randn(500, 3, generator=g) * 0.5
    u = mean + log_std.exp() * torch.randn(500, 3, generator=g) * 2
    ref = TransformedDistribution(Normal(mean.double(), log_std.double().exp()),
                                  [TanhTransform(cache_size=1)])
    a = ref.transforms[0](u.double())  # the transform caches u: no atanh round trip
    want = ref.log_prob(a).sum(-1)
    got = squashed_log_prob(u.double(), mean.double(), log_std.double())
    torch.testing.assert_close(got, want)
    # and the textbook form, log N(u) - sum log(1 - tanh(u)^2), where it is well conditioned
    small = u.abs().max(-1).values < 3
    textbook = Normal(mean.double(), log_std.double().exp()).log_prob(u.double()).sum(-1) \
        - torch.log(1 - torch.tanh(u.double()) ** 2).sum(-1)
    torch.testing.assert_close(got[small], textbook[small])
    # squash's sample and log-prob are the same thing, from the noise
    noise = (u - mean) / log_std.exp()
    action, logp = squash(mean, log_std, noise)
    torch.testing.assert_close(action, torch.tanh(u))
    torch.testing.assert_close(logp, squashed_log_prob(u, mean, log_std))
    # finite where tanh(u) rounds to 1, where log(1 - tanh(u)^2) would be -inf
    big = torch.tensor([[30.0]])
    assert torch.isfinite(squashed_log_prob(big, torch.zeros(1, 1), torch.zeros(1, 1))).all()


def by_hand(p: SAC, batch: dict[str, torch.Tensor], noise: torch.Tensor,
            weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The three losses, written out from the paper's formulas with torch.distributions."""
    alpha = p.temperature.log_alpha.detach().exp()
    scale, bias = p.action_scale, p.action_bias

    def sample(obs, eps):
        mean, log_std = p.actor(obs)
        u = mean + log_std.exp() * eps
        dist = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform(cache_size=1)])
        a = dist.transforms[0](u)
        return a, dist.log_prob(a).sum(-1)

    with torch.no_grad():
        a2, logp2 = sample(batch["next_obs"], noise[0])
        t1, t2 = p.critic_target(batch["next_obs"], a2)
        discount = batch.get("discount", torch.full_like(batch["reward"], p.cfg.gamma))
        y = batch["reward"] + discount * (1 - batch["terminated"].float()) * (
            torch.min(t1, t2) - alpha * logp2)
    unit = (batch["action"] - bias) / scale
    q1, q2 = p.critic(batch["obs"], unit)
    per_row = 0.5 * ((q1 - y) ** 2 + (q2 - y) ** 2)
    critic = per_row.mean() if weights is None else (weights * per_row).mean()
    a, logp = sample(batch["obs"], noise[1])
    p1, p2 = p.critic(batch["obs"], a)
    actor = (alpha * logp - torch.min(p1, p2)).mean()
    temp = -(p.temperature.log_alpha * (logp.detach() + p.target_entropy)).mean()
    return {"critic_loss": critic, "actor_loss": actor, "alpha_loss": temp, "target": y}


@pytest.mark.parametrize("extra", ["plain", "weights", "discount"])
def test_the_losses_are_the_formulas(extra):
    p = policy(init_alpha=0.3)
    batch = batch_of(TWO)
    weights = None
    if extra == "weights":
        weights = torch.linspace(0.1, 1.0, 16)
    if extra == "discount":  # n-step returns: gamma^m per row replaces gamma
        batch["discount"] = torch.tensor([0.99 ** m for m in (1, 2, 3, 4)] * 4)
    noise = torch.randn(2, 16, 2, generator=torch.Generator().manual_seed(7))
    got = p.losses(batch, weights, noise)
    want = by_hand(p, batch, noise, weights)
    for key in ("critic_loss", "actor_loss", "alpha_loss", "target"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5, msg=key)
    assert p.target_entropy == -2.0  # -|A|


def test_the_actor_loss_moves_the_actor_only_and_the_target_nothing():
    p = policy()
    out = p.losses(batch_of(TWO), None, torch.randn(2, 16, 2))
    critic = list(p.critic.parameters())
    grads = torch.autograd.grad(out["actor_loss"], critic + list(p.actor.parameters()),
                                allow_unused=True)
    assert all(g is None for g in grads[:len(critic)])
    assert any(g is not None and g.abs().sum() > 0 for g in grads[len(critic):])
    assert not out["target"].requires_grad


@pytest.mark.parametrize("target_entropy,direction", [(5.0, 1), (-50.0, -1)])
def test_the_temperature_rises_below_the_target_entropy_and_falls_above(target_entropy,
                                                                        direction):
    p = policy(target_entropy=target_entropy)
    before = p.alpha
    batch = batch_of(TWO)
    for _ in range(5):
        p.learn(batch)
    assert (p.alpha - before) * direction > 0
    frozen = policy(autotune=False, init_alpha=0.2)
    frozen.learn(batch)
    assert frozen.alpha == pytest.approx(0.2)


def test_actions_stay_in_the_env_bounds_random_first_then_the_policy():
    p = policy(random_steps=100)
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    for step in (0, 100):
        a = p.act(obs, env_step=step).actions
        assert a.shape == (256, 2) and a.dtype == np.float32
        assert (a >= [-1.0, 0.0]).all() and (a <= [1.0, 3.0]).all()
    with torch.no_grad():
        mean, _ = p.actor(torch.from_numpy(obs))
    np.testing.assert_allclose(p.act_eval(obs), torch.tanh(mean).numpy() * [1.0, 1.5]
                               + [0.0, 1.5], rtol=1e-5, atol=1e-6)


def test_priorities_are_the_critics_mean_td_error_and_weights_scale_the_critic_loss():
    p = policy()
    noise = torch.randn(2, 16, 2)
    batch = batch_of(TWO)
    plain = p.losses(batch, None, noise)
    doubled = p.losses(batch, torch.full((16,), 2.0), noise)
    torch.testing.assert_close(doubled["critic_loss"], 2 * plain["critic_loss"])
    out = policy().learn(batch)
    assert out.priorities.shape == (16,) and (out.priorities >= 0).all()


def test_observations_are_normalised_at_use_by_the_statistics_the_actor_carries():
    p = policy(PENDULUM, obs_norm=True)
    assert isinstance(p, NormalizesObservations) and p.tracks_obs_stats
    raw = np.random.default_rng(1).normal(5.0, 3.0, size=(1000, 3)).astype(np.float32)
    # chunks store raw observations: replay outlives many versions' statistics
    assert p.preprocess(raw) is raw
    p.merge_obs_stats(RunningMoments.of(raw))
    normed = p._normalized(torch.from_numpy(raw))
    assert abs(float(normed.mean())) < 0.05 and abs(float(normed.std()) - 1) < 0.05
    np.testing.assert_allclose(normed.numpy(), p.actor.obs_norm.normalize(raw), rtol=1e-5,
                               atol=1e-5)
    # the acting side normalises with the version it loaded, the learner at every batch
    acting = policy(PENDULUM, obs_norm=True)
    acting.load_policy(3, p.policy_state())
    np.testing.assert_allclose(acting.act_eval(raw[:5]), p.act_eval(raw[:5]), rtol=1e-6)
    with torch.no_grad():
        mean, _ = p.actor(normed[:5])
    np.testing.assert_allclose(p.act_eval(raw[:5]), 2 * torch.tanh(mean).numpy(), rtol=1e-5,
                               atol=1e-6)
    batch = batch_of(PENDULUM)
    noise = torch.randn(2, 16, 1)
    plain = policy(PENDULUM)
    plain.load_state_dict({k: v for k, v in p.state_dict().items()
                           if not k.startswith("actor.obs_norm")})
    torch.testing.assert_close(
        p.losses(batch, None, noise)["target"],
        plain.losses({**batch, "obs": p._normalized(batch["obs"]),
                      "next_obs": p._normalized(batch["next_obs"])}, None, noise)["target"])
    assert not policy(PENDULUM).tracks_obs_stats


def test_a_reward_model_rewrites_what_sac_learns_from():
    cfg = SACConfig(hidden_sizes=(8,), reward_model={"path": "rnd", "kwargs": {"scale": 1.0}})
    wrapped = with_reward_model(SAC(cfg, PENDULUM, seed=0), cfg, PENDULUM, 0)
    assert isinstance(wrapped, WithRewardModel)
    plain = SAC(cfg, PENDULUM, seed=0)
    batch = batch_of(PENDULUM)
    rewards = wrapped.model.estimate(batch)
    out = wrapped.learn(batch)
    plain.learn({**batch, "reward": rewards})
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(wrapped.state_dict()[key], value, msg=key)
    assert "reward_model/intrinsic_mean" in out.metrics and "critic_loss" in out.metrics


def test_a_checkpoint_carries_everything_and_the_noise_stream_goes_on():
    p = policy()
    batch = batch_of(TWO)
    p.learn(batch)
    q = policy()
    q.load_state_dict(p.state_dict())
    for key, value in p.state_dict().items():
        torch.testing.assert_close(q.state_dict()[key], value, msg=key)
    a, b = copy.deepcopy(p), q
    a.learn(batch)
    b.learn(batch)
    for key, value in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[key], value, msg=key)
    assert b.train_iterations == 2


def test_sac_has_the_capabilities_its_spec_says():
    from rlfleet.shared.algos.registry import algo_spec

    names = {c.__name__ for c in capabilities_of(policy())}
    assert names == set(algo_spec("sac").capabilities)
    assert math.isclose(policy().alpha, 1.0)


def test_collectors_act_at_random_in_the_box_before_torch_loads():
    from rlfleet.collector.acting import RandomPolicy

    random = RandomPolicy(TWO, seed=0)
    a = random.act(np.zeros((500, 4), dtype=np.float32), 0).actions
    assert a.shape == (500, 2) and a.dtype == np.float32
    assert (a >= [-1.0, 0.0]).all() and (a <= [1.0, 3.0]).all()
    assert a[:, 1].max() > 2.5 and a[:, 1].min() < 0.5  # the whole box, not a corner
    with pytest.raises(ValueError, match="bounded action space"):
        RandomPolicy(EnvSpec(obs_shape=(3,), action_shape=(1,), action_low=(-np.inf,),
                             action_high=(np.inf,)), seed=0)
