"""The optimizer boundary: the fused Adam kernel where this torch has it and accepts the call,
`torch.optim.Adam` where it does not, with the same steps either way; the private `_foreach`
helpers have public fallbacks."""

from __future__ import annotations

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
