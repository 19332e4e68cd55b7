"""The optimizer boundary: the fused Adam kernel where this torch has it and accepts the call,
`torch.optim.Adam` where it does not, with the same steps either way; the private `_foreach`
helpers have public fallbacks."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from rlfleet.shared.algos import optim
from rlfleet.shared.algos.adam import FusedAdam
from rlfleet.shared.algos.nets import clip_grad_norm


def _net(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _train(net: torch.nn.Module, opt, steps: int = 20) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(32, 4, generator=gen)
        loss = net(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def _reference(steps: int = 20) -> torch.nn.Module:
    net = _net()
    _train(net, torch.optim.Adam(net.parameters(), lr=1e-2), steps)
    return net


def _close(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(
        a.state_dict().values(), b.state_dict().values(), strict=True))


def test_adam_is_the_fused_kernel_where_torch_has_it():
    net = _net()
    opt = optim.adam(net.parameters(), lr=1e-2)
    assert isinstance(opt, FusedAdam) and isinstance(opt, optim.Optimizer)
    _train(net, opt)
    assert opt.fallback is None and _close(net, _reference())


def test_adam_is_torch_optim_where_the_kernel_is_absent(monkeypatch):
    monkeypatch.delattr(torch, "_fused_adam_")
    assert not optim.fused_adam_available()
    net = _net()
    opt = optim.adam(net.parameters(), lr=1e-2)
    assert isinstance(opt, torch.optim.Adam)
    _train(net, opt)
    assert _close(net, _reference())


def test_a_fused_adam_whose_kernel_refuses_goes_on_with_torch_optim(monkeypatch):
    """Refused at the sixth step: the five fused steps' state is handed over, the count of
    the refused one is taken back, and the run ends where torch.optim.Adam's would."""
    net = _net()
    opt = optim.adam(net.parameters(), lr=1e-2)
    _train(net, opt, 5)
    kernel = torch._fused_adam_

    def refuse(*args, **kwargs):
        raise RuntimeError("not on this device")

    monkeypatch.setattr(torch, "_fused_adam_", refuse)
    gen = torch.Generator().manual_seed(1)
    reference = _net()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for step in range(20):
        x = torch.randn(32, 4, generator=gen)
        for model, o in ((net, opt), (reference, ref_opt)):
            if model is net and step < 5:
                continue  # taken above, with the same inputs
            loss = model(x).pow(2).mean()
            o.zero_grad(set_to_none=True)
            loss.backward()
            o.step()
    monkeypatch.setattr(torch, "_fused_adam_", kernel)
    assert isinstance(opt.fallback, torch.optim.Adam)
    assert _close(net, reference)
    state = opt.state_dict()  # the fallback's, in the layout both load
    assert float(state["state"][0]["step"]) == 20.0


def test_the_foreach_helpers_have_fallbacks(monkeypatch):
    net = _net()
    net(torch.randn(8, 4)).sum().backward()
    params = list(net.parameters())
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
    monkeypatch.delattr(torch, "_foreach_norm")
    monkeypatch.delattr(torch, "_foreach_mul_")
    norm = clip_grad_norm(params, 0.5)
    assert torch.allclose(norm, expected)
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
    assert abs(float(after) - 0.5) < 1e-4


# -- an algorithm on each path: the kernel removed before rlfleet is imported, or refusing ------

# A DQN (gamma 0: Q(s, a) regresses on the reward) stepped on one fixed batch; what each path
# prints or returns: its optimizer's class, the first and last losses, the final weights.
_DQN_RUN = """
import json, sys
import torch
if __name__ == "__main__" and sys.argv[1:] == ["remove"]:
    del torch._fused_adam_  # before rlfleet is imported: nothing may have kept a reference
from rlfleet.shared.algos import optim
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.contract.spec import EnvSpec

def run(updates=150):
    cfg = DQNConfig(hidden_sizes=(16,), lr=0.01, gamma=0.0, target_update_every=1000,
                    max_grad_norm=100.0)
    learner = DQN(cfg, EnvSpec(obs_shape=(2,), n_actions=3), seed=0)
    batch = {"obs": torch.tensor([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0], [0.0, 0.0]]),
             "action": torch.tensor([0, 1, 2, 1]),
             "reward": torch.tensor([-2.0, -2.3, -1.0, 5.0]),
             "next_obs": torch.zeros(4, 2),
             "terminated": torch.tensor([False, False, True, False])}
    losses = [float(learner.learn(batch).metrics["loss"]) for _ in range(updates)]
    opt = learner.optimizer
    return {"optimizer": f"{type(opt).__module__}.{type(opt).__qualname__}",
            "fallback": type(getattr(opt, "fallback", None)).__qualname__,
            "kernel": optim.fused_adam_available(), "first": losses[0], "last": losses[-1],
            "step": float(opt.state_dict()["state"][0]["step"]),
            "weights": {k: v.tolist() for k, v in learner.q.state_dict().items()}}

if __name__ == "__main__":
    print(json.dumps(run()))
"""


def _dqn_run_without_the_kernel(tmp_path) -> dict:
    """The run in a fresh Python whose torch lost `_fused_adam_` before rlfleet came."""
    script = tmp_path / "dqn_run.py"
    script.write_text(_DQN_RUN)
    done = subprocess.run([sys.executable, str(script), "remove"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _dqn_run_here() -> dict:
    """The run in this process, with torch as the test left it."""
    namespace: dict = {"__name__": "dqn_run"}
    exec(compile(_DQN_RUN, "dqn_run", "exec"), namespace)
    return namespace["run"]()


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.allclose(torch.tensor(a[k]), torch.tensor(b[k]), atol=1e-5) for k in a)


def test_without_the_kernel_an_algorithm_learns_with_torch_optim_adam(tmp_path):
    """torch without `torch._fused_adam_` (a build or release that lacks it), removed before
    rlfleet is imported: `optim.adam` gives `torch.optim.Adam`, the DQN learns, and its
    weights end where the fused kernel's do."""
    without = _dqn_run_without_the_kernel(tmp_path)
    assert without["kernel"] is False
    assert without["optimizer"] == "torch.optim.adam.Adam"
    assert without["step"] == 150.0
    assert without["last"] < 0.1 * without["first"], without
    fused = _dqn_run_here()
    assert fused["kernel"] is True and fused["optimizer"].endswith("adam.FusedAdam")
    assert fused["fallback"] == "NoneType"
    assert _same_weights(without["weights"], fused["weights"])


def test_with_a_refusing_kernel_an_algorithm_learns_on(monkeypatch, caplog):
    """The kernel is there but refuses every step (a device or dtype it does not support):
    the first step already goes to `torch.optim.Adam`, with a warning, and the DQN learns
    to the same weights as without the kernel."""
    def refuse(*args, **kwargs):
        raise RuntimeError("_fused_adam_ is not implemented for this device")

    monkeypatch.setattr(torch, "_fused_adam_", refuse)
    with caplog.at_level("WARNING", logger="rlfleet.optim"):
        refused = _dqn_run_here()
    assert refused["kernel"] is True and refused["optimizer"].endswith("adam.FusedAdam")
    assert refused["fallback"] == "Adam" and refused["step"] == 150.0
    assert refused["last"] < 0.1 * refused["first"], refused
    assert [r for r in caplog.records if "refused a step" in r.getMessage()]
    monkeypatch.delattr(torch, "_fused_adam_")  # the other path, in this process
    without = _dqn_run_here()
    assert without["optimizer"] == "torch.optim.adam.Adam"
    assert _same_weights(refused["weights"], without["weights"])
