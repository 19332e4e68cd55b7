"""V-trace against values worked out by hand, and APPO learning on top of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.shared.algos.appo import APPO, APPOConfig
from rlfleet.shared.algos.appo.vtrace import vtrace
from rlfleet.shared.algos.ppo import gae
from rlfleet.shared.contract.spec import EnvSpec

G = 0.9


def test_on_policy_it_is_the_n_step_return_to_the_end_of_the_run():
    """rho = 1, lambda = 1: v_t = r_t + g r_{t+1} + ... + g^k V(bootstrap)."""
    r = np.array([1.0, 2.0, 3.0])
    v = np.array([0.5, 0.4, 0.3])
    boot = 10.0
    out = vtrace(np.zeros(3), v, np.array([0.4, 0.3, boot]), r, np.full(3, G),
                 np.array([False, False, True]))
    expect = [1 + G * 2 + G * G * 3 + G ** 3 * boot, 2 + G * 3 + G * G * boot, 3 + G * boot]
    np.testing.assert_allclose(out.vs, expect, rtol=1e-6)
    # advantages: r_t + g v_{t+1} - V(x_t), the next target at a cut being the bootstrap
    np.testing.assert_allclose(out.advantages, [1 + G * expect[1] - 0.5,
                                                2 + G * expect[2] - 0.4, 3 + G * boot - 0.3],
                               rtol=1e-6)
    np.testing.assert_allclose(out.clipped_rhos, 1.0)
    # and equals GAE(lambda=1)'s returns on the same values
    _, returns = gae(r, v, np.array([0, 0, boot]), np.zeros(3, bool),
                     np.array([False, False, True]), G, 1.0)
    np.testing.assert_allclose(out.vs, returns, rtol=1e-6)


def test_importance_weights_are_truncated_at_rho_bar_and_c_bar():
    """Two rows, one run, V = 0 everywhere, bootstrap 0: rho_0 = 2 (truncated to 1.5 in
    delta, to 1.2 in the trace), rho_1 = 0.5 (untruncated)."""
    log_rhos = np.log([2.0, 0.5])
    r = np.array([1.0, 1.0])
    out = vtrace(log_rhos, np.zeros(2), np.zeros(2), r, np.full(2, G),
                 np.array([False, True]), rho_bar=1.5, c_bar=1.2)
    d1 = 0.5 * 1.0
    d0 = 1.5 * 1.0
    v1 = d1
    v0 = d0 + G * 1.2 * v1
    np.testing.assert_allclose(out.vs, [v0, v1], rtol=1e-6)
    np.testing.assert_allclose(out.clipped_rhos, [1.5, 0.5])
    np.testing.assert_allclose(out.advantages, [1.5 * (1 + G * v1), 0.5 * 1.0], rtol=1e-6)


def test_an_episode_end_inside_a_chunk_stops_the_recursion():
    """Rows 0-1 end with a termination, rows 2-3 are the next episode cut by the chunk's
    end (bootstrapped from 5): nothing of the second leaks into the first."""
    r = np.array([1.0, 1.0, 2.0, 2.0])
    v = np.array([0.1, 0.2, 0.3, 0.4])
    terminated = np.array([False, True, False, False])
    cut = np.array([False, True, False, True])
    next_v = np.array([0.2, 99.0, 0.4, 5.0])  # 99: a terminated row's next value is unused
    out = vtrace(np.zeros(4), v, next_v, r, G * (1 - terminated), cut)
    np.testing.assert_allclose(out.vs, [1 + G * 1, 1, 2 + G * (2 + G * 5), 2 + G * 5],
                               rtol=1e-6)


def test_a_time_limit_cut_bootstraps_from_the_value_where_it_stopped():
    """A truncation is a cut without termination: its target is r + g V(next_obs)."""
    out = vtrace(np.zeros(1), np.array([0.0]), np.array([7.0]), np.array([1.0]),
                 np.array([G]), np.array([True]))
    np.testing.assert_allclose(out.vs, [1 + G * 7.0], rtol=1e-6)
    with pytest.raises(ValueError, match="last row must end a run"):
        vtrace(np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2), np.full(2, G),
               np.array([True, False]))


def _rollout(n: int = 64, seed: int = 0, log_prob: float = -0.69) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cut = torch.zeros(n, dtype=torch.bool)
    cut[31], cut[-1] = True, True
    return {"obs": torch.randn(n, 4, generator=g), "next_obs": torch.randn(n, 4, generator=g),
            "action": torch.randint(0, 2, (n,), generator=g), "reward": torch.ones(n),
            "terminated": torch.zeros(n, dtype=torch.bool), "cut": cut,
            "log_prob": torch.full((n,), log_prob), "value": torch.zeros(n),
            "bootstrap_value": torch.zeros(n)}


@pytest.mark.parametrize("impala", [False, True])
def test_appo_learns_with_its_importance_weights_reported(impala):
    policy = APPO(APPOConfig(batch_size=32, impala=impala, rho_bar=1.0), EnvSpec(
        obs_shape=(4,), n_actions=2), seed=0)
    before = {k: v.clone() for k, v in policy.policy_state().items()}
    # a behaviour policy that was far less likely to act so: rho = pi / mu > 1, truncated
    out = policy.learn(_rollout(log_prob=-3.0))
    m = {k: float(v) for k, v in out.metrics.items()}
    assert m["importance_weight_mean"] == pytest.approx(1.0)
    assert m["importance_weight_truncated"] == pytest.approx(1.0)
    assert all(np.isfinite(v) for v in m.values())
    assert policy.train_iterations == 2  # 64 rows, minibatches of 32, one epoch
    after = policy.policy_state()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_appo_refuses_c_bar_above_rho_bar():
    with pytest.raises(ValueError, match="algo.c_bar=2.0 must be at most algo.rho_bar=1.0"):
        APPO(APPOConfig(c_bar=2.0), EnvSpec(obs_shape=(4,), n_actions=2), seed=0)
