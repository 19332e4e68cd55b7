"""V-trace (Espeholt et al. 2018, "IMPALA"): value targets and policy-gradient advantages
for experience acted by an older policy than the one learning.

Rows are runs of consecutive steps, as in a rollout of whole chunks: each run ends at a `cut`
row (an episode end, a time limit, or where a chunk's rows of one env stop), after which the
next row starts another run. With importance ratios rho_t = pi(a_t|x_t) / mu(a_t|x_t) of the
learning policy pi against the behaviour policy mu that acted:

    delta_t = min(rho_bar, rho_t) * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    v_t - V(x_t) = delta_t + gamma_t * c_t * (v_{t+1} - V(x_{t+1}))     (0 past a cut)
    c_t = lambda * min(c_bar, rho_t)
    A_t = min(rho_bar, rho_t) * (r_t + gamma_t * v_{t+1} - V(x_t))

`gamma_t` is 0 on a terminated row; `V(x_{t+1})` on a cut row is the value of the
observation the run stopped at (a truncated episode bootstraps from it), and `v_{t+1}` there
is that same value. With pi = mu (every rho 1) and lambda 1, v_t is the discounted return to
the end of the run, bootstrapped: the n-step return. Like `gae`, the recursion is one loop over
Python floats, the rest vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class VTrace:
    """Per row: `vs` the value targets, `advantages` the policy-gradient advantages (with
    the clipped importance weight), `clipped_rhos` min(rho_bar, rho)."""

    vs: np.ndarray
    advantages: np.ndarray
    clipped_rhos: np.ndarray


def vtrace(log_rhos: np.ndarray, values: np.ndarray, next_values: np.ndarray,
           rewards: np.ndarray, discounts: np.ndarray, cut: np.ndarray, rho_bar: float = 1.0,
           c_bar: float = 1.0, lam: float = 1.0) -> VTrace:
    """V-trace targets over runs of rows (see the module's docstring). `next_values[t]` is
    V(x_{t+1}): the next row's value inside a run, the bootstrap value on a cut row (any
    value where `discounts[t]` is 0). The last row must be a cut."""
    log_rhos = np.asarray(log_rhos, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    nv = np.asarray(next_values, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64)
    disc = np.asarray(discounts, dtype=np.float64)
    cut = np.asarray(cut, dtype=bool)
    n = v.shape[0]
    if n and not cut[-1]:
        raise ValueError("vtrace: the last row must end a run (cut=True): its next value is "
                         "otherwise unknown")
    rhos = np.exp(log_rhos)
    clipped = np.minimum(rho_bar, rhos)
    cs = lam * np.minimum(c_bar, rhos)
    deltas = (clipped * (r + disc * nv - v)).tolist()
    carry = np.where(cut, 0.0, disc * cs).tolist()
    out = [0.0] * n
    acc = 0.0
    for t in range(n - 1, -1, -1):
        acc = deltas[t] + carry[t] * acc
        out[t] = acc
    vs = np.asarray(out, dtype=np.float64) + v
    vs_next = np.where(cut, nv, np.append(vs[1:], 0.0)) if n else vs
    advantages = clipped * (r + disc * vs_next - v)
    return VTrace(vs.astype(np.float32), advantages.astype(np.float32),
                  clipped.astype(np.float32))
