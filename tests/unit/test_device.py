"""Devices and precision: every path that runs on a CPU is tested here on the CPU (device
selection, refusals, autocast in bf16 and fp16 with its scaler, fp32 weights from a mixed
learner, the staging buffers with pinning off, frames stacked after the copy, the weight
region filled in one copy a dtype, the group's backend); the CUDA paths skip where there is
no GPU and run on a machine with one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlfleet.learner.feed.rollouts import concat_chunks
from rlfleet.learner.feed.shm import SHM_DIR
from rlfleet.learner.feed.staging import GpuClock, Stager, expand_frames, expand_stacks
from rlfleet.learner.group.member import choose_backend
from rlfleet.learner.output.weight_relay import WeightRegion, _views
from rlfleet.learner.placement import place
from rlfleet.shared.algos.capabilities import MixedPrecision, Placeable
from rlfleet.shared.algos.device import (
    Precision,
    cuda_refusal,
    host_state,
    local_rank,
    place_policy,
    resolve_device,
)
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.ppo import PPO
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.contract.config import ConfigError, LearnerConfig
from rlfleet.shared.contract.frames import OBS_STACK, pack, stack_index
from rlfleet.shared.contract.spec import EnvSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = EnvSpec(obs_shape=(4,), n_actions=2)
HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device on this machine (CI's "
                                "has none); runs on a GPU machine")
no_cuda = pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without CUDA")


def dqn_batch(n: int = 64, seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b = {"obs": torch.randn(n, 4, generator=g), "action": torch.randint(0, 2, (n,), generator=g),
         "reward": torch.rand(n, generator=g), "next_obs": torch.randn(n, 4, generator=g),
         "terminated": torch.rand(n, generator=g) < 0.1}
    return {k: v.to(device) for k, v in b.items()}


# -- which device ----------------------------------------------------------------------------

def test_a_setting_names_a_device_on_this_machine(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    assert resolve_device("cpu", count=4) == torch.device("cpu")
    assert resolve_device("auto", count=0) == torch.device("cpu")
    assert resolve_device("auto", count=2) == torch.device("cuda", 0)
    assert resolve_device("cuda:1", count=2) == torch.device("cuda", 1)
    # a learner group's rank i on GPU i, more ranks than GPUs sharing them
    assert resolve_device("cuda", rank=1, count=2) == torch.device("cuda", 1)
    assert resolve_device("cuda", rank=3, count=2) == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert local_rank() == 1
    assert resolve_device("cuda", count=4) == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("SLURM_LOCALID", "2")
    assert resolve_device("auto", count=4) == torch.device("cuda", 2)
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda", count=0)
    with pytest.raises(ValueError, match=r"has 2 CUDA devices \(cuda:0..cuda:1\)"):
        resolve_device("cuda:2", count=2)


def test_refusals_name_the_field():
    assert cuda_refusal("auto", "learner.device", 0) is None
    assert cuda_refusal("cpu", "learner.device", 0) is None
    assert cuda_refusal("cuda", "learner.device", 1) is None
    why = cuda_refusal("cuda", "learner.device", 0)
    assert why is not None and why.startswith("learner.device='cuda'")
    why = cuda_refusal("cuda:3", "collector.device", 2)
    assert why is not None and why.startswith("collector.device='cuda:3'")


@no_cuda
def test_rlfleet_up_asking_for_cuda_here_exits_2_naming_the_field(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlfleet", "up", "--config",
                           str(REPO_ROOT / "configs" / "cartpole-dqn.yaml"), "--run-dir",
                           str(tmp_path / "run"), "learner.device=cuda"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "learner.device='cuda'" in done.stderr and "no CUDA device" in done.stderr


class Plain:
    """A user's policy without to(device) or set_precision."""

    on_policy = False


def test_a_policy_is_placed_or_refused_naming_the_field():
    dqn = DQN(DQNConfig(), CARTPOLE, seed=0)
    assert isinstance(dqn, Placeable) and isinstance(dqn, MixedPrecision)
    placement = place(dqn, LearnerConfig(device="auto", precision="bf16"), count=0)
    assert placement.device == torch.device("cpu") and dqn.precision.name == "bf16"
    assert placement.status()["device"] == "cpu"
    # a policy that is not Placeable: auto means the CPU, an explicit CUDA is refused
    assert place_policy(Plain(), "auto", "learner.device", count=1) == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"learner.device='cuda': policy Plain is not "
                                          "Placeable"):
        place(Plain(), LearnerConfig(device="cuda"), count=1)
    with pytest.raises(ConfigError, match=r"learner.precision='fp16': policy Plain has no "
                                          "set_precision"):
        place(Plain(), LearnerConfig(device="cpu", precision="fp16"))
    with pytest.raises(ConfigError, match=r"collector.device='cuda:1'"):
        place_policy(dqn, "cuda:1", "collector.device", count=1)


# -- precision -----------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_mixed_precision_learner_keeps_fp32_weights_and_follows_fp32(precision):
    """Autocast on the CPU: the loss is the fp32 one to within the format's rounding, the
    weights, optimizer state and published state stay fp32, and its checkpoint loads into
    an fp32 learner that then acts alike."""
    fp32, mixed = DQN(DQNConfig(), CARTPOLE, seed=1), DQN(DQNConfig(), CARTPOLE, seed=1)
    mixed.set_precision(Precision(precision, "cpu"))
    for step in range(30):
        batch = dqn_batch(seed=step)
        a, b = fp32.learn(batch), mixed.learn(batch)
        assert torch.isfinite(b.metrics["loss"])
    assert abs(float(a.metrics["loss"]) - float(b.metrics["loss"])) < 0.05
    assert {v.dtype for v in mixed.policy_state().values()} == {torch.float32}
    state = mixed.state_dict()
    assert all(v.dtype == torch.float32 for k, v in state.items() if k.startswith("q."))
    restored = DQN(DQNConfig(), CARTPOLE, seed=7)
    restored.load_state_dict(state)
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    assert np.array_equal(restored.act_eval(obs), mixed.act_eval(obs))
    status = mixed.precision.status()
    assert status["precision"] == precision
    assert ("grad_scale" in status) == (precision == "fp16")


def test_fp16_skips_a_step_whose_gradients_overflow():
    policy = DQN(DQNConfig(), CARTPOLE, seed=1)
    policy.set_precision(Precision("fp16", "cpu"))
    before = {k: v.clone() for k, v in policy.policy_state().items()}
    batch = dqn_batch()
    batch["obs"] = torch.full_like(batch["obs"], 1e6)  # past fp16's range: inf activations
    scale = policy.precision.scaler.get_scale()
    policy.learn(batch)
    after = policy.policy_state()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the step was skipped
    assert policy.precision.scaler.get_scale() < scale


def test_ppo_learns_in_bf16_with_fp32_weights():
    policy = PPO(PPOConfig(batch_size=32, epochs=1), CARTPOLE, seed=0)
    policy.set_precision(Precision("bf16", "cpu"))
    n = 64
    cut = torch.zeros(n, dtype=torch.bool)
    cut[31], cut[63] = True, True
    out = policy.learn({"obs": torch.randn(n, 4), "action": torch.randint(0, 2, (n,)),
                        "reward": torch.ones(n), "terminated": torch.zeros(n, dtype=torch.bool),
                        "cut": cut, "log_prob": torch.full((n,), -0.69),
                        "value": torch.zeros(n), "bootstrap_value": torch.zeros(n)})
    assert all(np.isfinite(float(v)) for v in out.metrics.values())
    assert {v.dtype for v in policy.policy_state().values()} == {torch.float32}


# -- feeding ---------------------------------------------------------------------------------

def stacked_frames(n: int = 40, stack: int = 4) -> dict[str, np.ndarray]:
    t = np.arange(n + stack)
    frames = np.zeros((len(t), 5, 5), np.uint8)
    frames[:, 0, 0] = t
    rows = np.arange(n)[:, None] + np.arange(stack)[None, :]
    cut = np.zeros(n, bool)
    cut[-1] = True
    return {"obs": frames[rows], "next_obs": frames[rows + 1], "reward": t[:n].astype(
        np.float32), "action": np.zeros(n, np.int64), "terminated": np.zeros(n, bool),
            "cut": cut}


def test_one_stack_a_row_gives_both_observations():
    arrays = stacked_frames()
    packed = pack(arrays)
    rows = np.array([[3, 17, 0, 39]])
    index = stack_index(packed, rows)
    assert index is not None and index.shape == (1, 4, 5)
    stack = torch.from_numpy(np.take(packed["frames"], index[0], axis=0))
    data = expand_stacks({OBS_STACK: stack})
    assert np.array_equal(data["obs"].numpy(), arrays["obs"][rows[0]])
    assert np.array_equal(data["next_obs"].numpy(), arrays["next_obs"][rows[0]])
    # a row whose next_obs is not its obs moved on by one frame: no stack
    broken = dict(packed)
    broken["next_obs_frames"] = packed["next_obs_frames"].copy()
    broken["next_obs_frames"][17, 0] = 0
    assert stack_index(broken, rows) is None
    assert stack_index({"obs": arrays["obs"]}, rows) is None


def test_a_packed_rollout_is_stacked_after_the_copy():
    chunks = [pack(stacked_frames(30)), pack(stacked_frames(20))]
    whole = concat_chunks(chunks)
    packed = concat_chunks(chunks, packed=True)
    assert "frames" in packed and "obs" not in packed
    assert packed["frames"].numel() < whole["obs"].numel()  # each frame once
    got = Stager(torch.device("cpu"), pin=False, copies=True).put(packed)
    for name in whole:
        assert torch.equal(got[name], whole[name]), name
    assert expand_frames({"x": torch.ones(1)}) == {"x": torch.ones(1)}


def test_the_stager_without_pinning_double_buffers_copies_of_the_batches():
    """The staging path's bookkeeping on the CPU: two slots in turn, each batch copied out
    of its source (which the data process may then reuse), stacks expanded."""
    stager = Stager(torch.device("cpu"), pin=False, copies=True)
    sources = [{OBS_STACK: torch.full((8, 5, 3, 3), i, dtype=torch.uint8),
                "reward": torch.full((8,), float(i))} for i in range(3)]
    staged = [stager.stage(s) for s in sources[:2]]
    sources[0]["reward"].fill_(-1)  # the source slot reused: the staged copy is not
    first, second = stager.ready(staged[0]), stager.ready(staged[1])
    assert torch.equal(first["reward"], torch.zeros(8))
    assert first["obs"].shape == (8, 4, 3, 3) and first["next_obs"].shape == (8, 4, 3, 3)
    assert first["reward"].data_ptr() != second["reward"].data_ptr()
    stager.done(staged[0])
    third = stager.ready(stager.stage(sources[2]))
    assert third["reward"].data_ptr() == first["reward"].data_ptr()  # slot 0 again
    assert torch.equal(third["reward"], torch.full((8,), 2.0))
    assert stager.status()["batches_staged"] == 3 and stager.status()["pinned"] is False
    # a CPU learner's default: the batch as it lies, no copy
    plain = Stager(torch.device("cpu"))
    src = {"reward": torch.ones(4)}
    assert plain.ready(plain.stage(src))["reward"] is src["reward"]


def test_the_gpu_clock_is_quiet_on_the_cpu():
    clock = GpuClock(torch.device("cpu"))
    clock.start()
    clock.end()
    assert clock.fractions() == {"gpu_busy_fraction": None, "gpu_wait_fraction": None}


class FakeEvent:
    """A CUDA event that happened at `t` seconds (what `GpuClock` reads of one)."""

    def __init__(self, t: float, done: bool = True) -> None:
        self.t, self.done = t, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, later: FakeEvent) -> float:
        return (later.t - self.t) * 1000.0


def test_the_gpu_clock_adds_busy_and_waiting_time_over_a_window_of_updates():
    """Updates of 3 ms with 1 ms gaps between them, the first without a gap before it; the
    last one not yet run on the GPU is left for later; the window keeps the newest 2."""
    clock = GpuClock(torch.device("cpu"), window=2)
    events, prev = [], None
    for k in range(4):
        start, end = FakeEvent(4e-3 * k), FakeEvent(4e-3 * k + 3e-3, done=k < 3)
        events.append((prev, start, end))
        prev = end
    clock._pending.extend(events)
    got = clock.fractions()
    assert clock.updates == 3 and len(clock._pending) == 1
    assert clock.busy_s == pytest.approx(9e-3) and clock.wait_s == pytest.approx(2e-3)
    assert got["gpu_window_updates"] == 2
    assert got["gpu_wait_fraction"] == pytest.approx(2 / 8, abs=1e-4)  # 1 ms gap in 4 ms, x2
    events[3][2].done = True
    assert clock.fractions()["gpu_window_updates"] == 2 and clock.updates == 4


def test_a_version_fills_the_weight_region_one_block_a_dtype():
    state = {"a.weight": torch.randn(3, 4), "a.bias": torch.randn(3),
             "steps": torch.tensor([5], dtype=torch.int64), "b.weight": torch.randn(2, 3)}
    region = WeightRegion(SHM_DIR, "rlfleet-test-wr-")
    try:
        layout = region._fill_from_device(state)  # the path a GPU learner's state takes
        views = _views(region.map, layout)
        for name, tensor in state.items():
            assert np.array_equal(views[name], tensor.numpy()), name
        floats = sorted(layout[n][0] for n in ("a.weight", "a.bias", "b.weight"))
        assert floats[1] - floats[0] in (12 * 4, 3 * 4)  # side by side: one copy for all
        del views
    finally:
        region.close()


def test_ranks_with_a_gpu_each_sum_over_nccl_others_over_gloo():
    assert choose_backend(["a|cuda:0", "a|cuda:1"], nccl_available=True) == "nccl"
    assert choose_backend(["a|cuda:0", "b|cuda:0"], nccl_available=True) == "nccl"
    assert choose_backend(["a|cuda:0", "a|cuda:0"], nccl_available=True) == "gloo"
    assert choose_backend(["a|cuda:0", "a|cpu"], nccl_available=True) == "gloo"
    assert choose_backend(["a|cpu", "b|cpu"], nccl_available=True) == "gloo"
    assert choose_backend(["a|cuda:0", "a|cuda:1"], nccl_available=False) == "gloo"


# -- on a GPU --------------------------------------------------------------------------------

@needs_cuda
def test_a_dqn_learns_on_the_gpu_from_pinned_double_buffers_and_publishes_fp32():
    device = torch.device("cuda")
    policy = DQN(DQNConfig(), CARTPOLE, seed=0)
    place(policy, LearnerConfig(device="cuda", precision="bf16"))
    assert next(policy.q.parameters()).device.type == "cuda"
    stager, clock = Stager(device, pin=True), GpuClock(device)
    batches = [dqn_batch(seed=s) for s in range(20)]
    staged = stager.stage(batches[0])
    for i in range(len(batches)):
        data = stager.ready(staged)
        clock.start()
        policy.learn(data)
        clock.end()
        stager.done(staged)
        if i + 1 < len(batches):
            staged = stager.stage(batches[i + 1])
    torch.cuda.synchronize()
    assert stager.status()["pinned"] and clock.fractions()["gpu_busy_fraction"] > 0
    state = policy.policy_state()
    assert {v.dtype for v in state.values()} == {torch.float32}
    region = WeightRegion(SHM_DIR, "rlfleet-test-wr-gpu-")
    try:
        layout = region.fill(state)
        views = _views(region.map, layout)
        for name, tensor in host_state(state).items():
            assert np.array_equal(views[name], tensor.numpy()), name
        del views
    finally:
        region.close()
    cpu = DQN(DQNConfig(), CARTPOLE, seed=5)
    cpu.load_state_dict(host_state(policy.state_dict()))
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    assert np.array_equal(cpu.act_eval(obs), policy.act_eval(obs))


@needs_cuda
def test_ppo_acts_and_learns_on_the_gpu():
    policy = PPO(PPOConfig(batch_size=32, epochs=1), CARTPOLE, seed=0)
    policy.to(torch.device("cuda"))
    out = policy.act(np.zeros((8, 4), np.float32), 0)
    assert out.actions.shape == (8,) and out.extras["value"].shape == (8,)
