"""Update rates of SAC and R2D2 on the CPU and on the GPU, for deploy/gpu-check.sh's `algos`
phase: one learner's `learn` calls on fixed batches of the ready configs' sizes, timed after a
warm-up (CUDA synchronised), printed one line per case and device."""

from __future__ import annotations

import time

import torch

from rlfleet.shared.algos.r2d2 import R2D2, R2D2Config
from rlfleet.shared.algos.sac import SAC, SACConfig
from rlfleet.shared.contract.spec import EnvSpec

CHEETAH = EnvSpec(obs_shape=(17,), action_shape=(6,), action_low=(-1.0,) * 6,
                  action_high=(1.0,) * 6)
NOVEL = EnvSpec(obs_shape=(2,), n_actions=2)


def sac_batch(device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in {
        "obs": torch.randn(256, 17), "next_obs": torch.randn(256, 17),
        "action": torch.rand(256, 6) * 2 - 1, "reward": torch.randn(256),
        "terminated": torch.zeros(256, dtype=torch.bool)}.items()}


def r2d2_batch(device: torch.device) -> dict[str, torch.Tensor]:
    B, L = 32, 16
    return {k: v.to(device) for k, v in {
        "obs": torch.randn(B, L, 2), "next_obs": torch.randn(B, L, 2),
        "action": torch.randint(0, 2, (B, L)), "reward": torch.rand(B, L),
        "terminated": torch.zeros(B, L, dtype=torch.bool),
        "cut": torch.zeros(B, L, dtype=torch.bool),
        "recurrent_h": torch.zeros(B, L, 64), "recurrent_c": torch.zeros(B, L, 64)}.items()}


def rate(policy, batch, device: torch.device, seconds: float = 4.0) -> float:
    policy.to(device)
    for _ in range(20):
        policy.learn(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            policy.learn(batch)
        n += 10
        if device.type == "cuda":
            torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def main() -> None:
    torch.set_num_threads(1)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available()
                                       else [])
    for device in devices:
        sac = SAC(SACConfig(), CHEETAH, seed=0)
        print(f"sac 256x256 batch 256 on {device}: "
              f"{rate(sac, sac_batch(device), device):,.0f} updates/s", flush=True)
        r2d2 = R2D2(R2D2Config(burn_in=4), NOVEL, seed=0)
        print(f"r2d2 lstm 64, 32 x 16 rows on {device}: "
              f"{rate(r2d2, r2d2_batch(device), device):,.0f} updates/s", flush=True)


if __name__ == "__main__":
    main()
