"""`FusedAdam` (shared/algos/adam.py) against `torch.optim.Adam(fused=True)`: the same
updates, interchangeable state, and no torch._dynamo import."""

from __future__ import annotations

import subprocess
import sys

import torch

from rlfleet.shared.algos.adam import FusedAdam
from rlfleet.shared.algos.nets import load_optimizer_state, mlp, optimizer_state


def _net(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return mlp(4, (32, 32), 2)


def _train(net: torch.nn.Module, opt, steps: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=gen)
        opt.zero_grad(set_to_none=True)
        net(x).pow(2).mean().backward()
        opt.step()


def test_the_same_updates_as_torch_fused_adam():
    a, b = _net(), _net()
    _train(a, torch.optim.Adam(a.parameters(), lr=3e-3, eps=1e-5, fused=True), 50)
    _train(b, FusedAdam(b.parameters(), lr=3e-3, eps=1e-5), 50)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_state_moves_between_the_two_through_a_checkpoint():
    """A checkpoint written with torch.optim.Adam (a learner on a torch without the fused
    kernel, or an earlier version's) resumes with FusedAdam and back, and training then goes
    on exactly as without the move."""
    ref = _net()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3, fused=True)
    _train(ref, ref_opt, 20)
    moved = _net()
    moved.load_state_dict(ref.state_dict())
    ours = FusedAdam(moved.parameters(), lr=1e-3)
    load_optimizer_state(ours, optimizer_state(ref_opt))
    _train(ref, ref_opt, 20, seed=2)
    _train(moved, ours, 20, seed=2)
    for pa, pb in zip(ref.parameters(), moved.parameters(), strict=True):
        assert torch.equal(pa, pb)
    back = _net()
    back.load_state_dict(moved.state_dict())
    theirs = torch.optim.Adam(back.parameters(), lr=1e-3, fused=True)
    load_optimizer_state(theirs, optimizer_state(ours))
    _train(moved, ours, 5, seed=3)
    _train(back, theirs, 5, seed=3)
    for pa, pb in zip(moved.parameters(), back.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert ours.state_dict()["state"][0]["step"].item() == 45


def test_learning_rate_is_read_and_set_through_param_groups():
    net = _net()
    opt = FusedAdam(net.parameters(), lr=1e-3)
    assert opt.param_groups[0]["lr"] == 1e-3
    opt.param_groups[0]["lr"] = 0.0  # as a schedule would
    before = [p.clone() for p in net.parameters()]
    _train(net, opt, 3)
    assert all(torch.equal(p, q) for p, q in zip(before, net.parameters(), strict=True))


def test_a_learner_policy_never_imports_the_compiler():
    code = ("import sys; from rlfleet.shared.algos.dqn import DQN;"
            "from rlfleet.shared.algos.dqn.config import DQNConfig;"
            "from rlfleet.shared.contract.spec import EnvSpec; import numpy as np, torch;"
            "spec = EnvSpec(obs_shape=(4,), n_actions=2);"
            "p = DQN(DQNConfig(), spec, 0); b = {'obs': torch.randn(8, 4),"
            " 'action': torch.zeros(8, dtype=torch.long), 'reward': torch.ones(8),"
            " 'next_obs': torch.randn(8, 4), 'terminated': torch.zeros(8, dtype=torch.bool),"
            " 'truncated': torch.zeros(8, dtype=torch.bool)}; p.learn(b); p.state_dict();"
            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
