"""Data-parallel learning is the same maths as one learner: ranks in a real gloo group (one
process each, loopback) train on disjoint shards of fixed data, and end with the weights one
learner gets from the whole batches."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from rlfleet.learner.group.member import DistReducer, GroupError, GroupMember
from rlfleet.shared.algos.appo import APPO, APPOConfig
from rlfleet.shared.algos.device import host_state
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.ppo import PPO
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.algos.r2d2 import R2D2, R2D2Config
from rlfleet.shared.algos.sac import SAC, SACConfig
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.contract.wire.group import GroupAssignment

from .helpers import wait_for

CARTPOLE = EnvSpec(obs_shape=(4,), n_actions=2)
NOVEL = EnvSpec(obs_shape=(2,), n_actions=2)  # CartPole without velocities
PENDULUM = EnvSpec(obs_shape=(3,), action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
UPDATES = 50


def assign(**fields) -> GroupAssignment:
    return GroupAssignment(epoch="e", **fields)
ATOL = 1e-5


# -- fixed data ------------------------------------------------------------------------------

def dqn_batches(batch: int, prioritized: bool) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(UPDATES):
        b = {"obs": torch.randn(batch, 4, generator=g),
             "action": torch.randint(0, 2, (batch,), generator=g),
             "reward": torch.rand(batch, generator=g),
             "next_obs": torch.randn(batch, 4, generator=g),
             "terminated": torch.rand(batch, generator=g) < 0.1}
        if prioritized:
            b["weights"] = 0.2 + 0.8 * torch.rand(batch, generator=g)
        out.append(b)
    return out


def sac_batches(batch: int) -> list[dict[str, torch.Tensor]]:
    """Pendulum-shaped transitions with n-step discounts and importance weights."""
    g = torch.Generator().manual_seed(17)
    return [{"obs": torch.randn(batch, 3, generator=g),
             "action": 4 * torch.rand(batch, 1, generator=g) - 2,
             "reward": torch.randn(batch, generator=g),
             "next_obs": torch.randn(batch, 3, generator=g),
             "terminated": torch.rand(batch, generator=g) < 0.1,
             "discount": 0.99 ** torch.randint(1, 4, (batch,), generator=g).float(),
             "weights": 0.2 + 0.8 * torch.rand(batch, generator=g)} for _ in range(UPDATES)]


def r2d2_batches(batch: int, length: int = 12) -> list[dict[str, torch.Tensor]]:
    """Sequences with stored states, importance weights and cuts (padding after them)."""
    g = torch.Generator().manual_seed(13)
    out = []
    for _ in range(UPDATES):
        cut = torch.rand(batch, length, generator=g) < 0.08
        out.append({"obs": torch.randn(batch, length, 2, generator=g),
                    "next_obs": torch.randn(batch, length, 2, generator=g),
                    "action": torch.randint(0, 2, (batch, length), generator=g),
                    "reward": torch.rand(batch, length, generator=g),
                    "terminated": cut & (torch.rand(batch, length, generator=g) < 0.5),
                    "cut": cut,
                    "recurrent_h": torch.randn(batch, length, 16, generator=g) * 0.1,
                    "recurrent_c": torch.randn(batch, length, 16, generator=g) * 0.1,
                    "weights": 0.2 + 0.8 * torch.rand(batch, generator=g)})
    return out


def ppo_rollouts(spec: EnvSpec, rounds: int, chunks: int, rows: int
                 ) -> list[list[dict[str, torch.Tensor]]]:
    """`rounds` rollouts, each `chunks` whole chunks of `rows` rows (each chunk ends cut)."""
    rng = np.random.default_rng(5)
    out = []
    for _ in range(rounds):
        rollout = []
        for _ in range(chunks):
            cut = np.zeros(rows, dtype=bool)
            cut[-1] = True
            cut[rng.integers(0, rows - 1)] = True
            act = (rng.integers(0, 2, rows) if spec.discrete
                   else rng.normal(size=(rows, 1)).astype(np.float32))
            rollout.append({
                "obs": torch.from_numpy(rng.normal(size=(rows, *spec.obs_shape))
                                        .astype(np.float32)),
                "next_obs": torch.from_numpy(rng.normal(size=(rows, *spec.obs_shape))
                                             .astype(np.float32)),
                "action": torch.from_numpy(act),
                "reward": torch.from_numpy(rng.normal(size=rows).astype(np.float32)),
                "terminated": torch.from_numpy(rng.random(rows) < 0.05),
                "cut": torch.from_numpy(cut),
                "log_prob": torch.from_numpy(-rng.random(rows).astype(np.float32)),
                "value": torch.from_numpy(rng.normal(size=rows).astype(np.float32)),
                "bootstrap_value": torch.from_numpy(np.where(cut, 0.3, 0.0)
                                                    .astype(np.float32))})
        out.append(rollout)
    return out


def concat(chunks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]} if chunks else {}


# share of each rollout's chunks per rank: uneven, and one rollout leaves rank 1 nothing
PPO_SHARES = [([0, 1, 2], [3, 4]), ([0, 1], [2, 3, 4]), ([0, 1, 2, 3, 4], []),
              ([0, 2, 4], [1, 3]), ([0], [1, 2, 3, 4])]


# -- the two ways to train -------------------------------------------------------------------

def train(case: str, reducer=None, rank: int = 0, world: int = 1, device: str = "cpu"
          ) -> dict[str, torch.Tensor]:
    """The case's training on `device`; its state dict on the host."""
    on = torch.device(device)
    if on.type == "cuda":  # fp32 for the comparison: no TF32 matmuls or convolutions
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def there(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(on) for k, v in b.items()}

    if case.startswith("dqn"):
        prioritized = case == "dqn-prioritized"
        batch = 64
        policy = DQN(DQNConfig(batch_size=batch // world, target_update_every=20), CARTPOLE,
                     seed=3)
        policy.to(on)
        policy.set_reducer(reducer)
        shard = batch // world
        for b in dqn_batches(batch, prioritized):
            part = there({k: v[rank * shard:(rank + 1) * shard] for k, v in b.items()})
            weights = part.pop("weights", None)
            policy.learn(part, weights)
        assert policy.train_iterations == UPDATES
        return host_state(policy.state_dict())
    if case == "sac":
        batch = 64
        policy = SAC(SACConfig(batch_size=batch // world, hidden_sizes=(32, 32)), PENDULUM,
                     seed=3)
        policy.to(on)
        policy.set_reducer(reducer)
        shard = batch // world
        for b in sac_batches(batch):
            part = there({k: v[rank * shard:(rank + 1) * shard] for k, v in b.items()})
            weights = part.pop("weights")
            policy.learn(part, weights)
        assert policy.train_iterations == UPDATES
        return host_state(policy.state_dict())
    if case == "r2d2":
        batch = 8  # sequences of 12 rows, some padded after a cut
        policy = R2D2(R2D2Config(batch_size=batch // world, lstm_size=16, hidden_sizes=(16,),
                                 burn_in=3, target_update_every=20), NOVEL, seed=3)
        policy.to(on)
        policy.set_reducer(reducer)
        shard = batch // world
        for b in r2d2_batches(batch):
            part = there({k: v[rank * shard:(rank + 1) * shard] for k, v in b.items()})
            weights = part.pop("weights")
            policy.learn(part, weights)
        assert policy.train_iterations == UPDATES
        return host_state(policy.state_dict())
    spec = PENDULUM if case == "ppo-continuous" else CARTPOLE
    policy = (APPO(APPOConfig(batch_size=64, epochs=2), spec, seed=3) if case == "appo"
              else PPO(PPOConfig(batch_size=64, epochs=2), spec, seed=3))
    policy.to(on)
    policy.set_reducer(reducer)
    for rollout, shares in zip(ppo_rollouts(spec, len(PPO_SHARES), 5, 64), PPO_SHARES,
                               strict=True):
        if world == 1:
            policy.learn(there(concat([rollout[i] for i in shares[0] + shares[1]])))
        else:
            policy.learn(there(concat([rollout[i] for i in shares[rank]])))
    assert policy.train_iterations == UPDATES  # 320 rows / 64 = 5 minibatches, 2 epochs, 5x
    return {k: v for k, v in host_state(policy.state_dict()).items() if k != "gen_state"}


CASES = ("dqn-uniform", "dqn-prioritized", "ppo", "ppo-continuous", "appo", "r2d2", "sac")


def _rank_main(cases: tuple[str, ...], rank: int, world: int, store_addr: str, out: str,
               device: str = "cpu") -> None:
    """One rank: every case in turn, in one group (the same collectives in the same order on
    every rank), each case's state saved to `out/<case>-rank<r>.safetensors`."""
    torch.set_num_threads(1)
    member = GroupMember("127.0.0.1", timeout_s=60, device=torch.device(device))
    assignment = assign(generation=1, rank=rank, world_size=world,
                                 store_addr=store_addr, ranks=[f"l{i}" for i in range(world)],
                                 publisher=rank == 0)
    reducer = member.form(assignment)
    assert member.backend == "gloo"  # one machine, one GPU at most: ranks share it
    try:
        for case in cases:
            save_file(train(case, reducer, rank, world, device),
                      str(Path(out) / f"{case}-rank{rank}.safetensors"))
    finally:
        member.close()


def run_group(cases: tuple[str, ...], world: int, tmp_path: Path, device: str = "cpu"
              ) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Each case trained by a group of `world` ranks: {case: every rank's state}. One group
    of processes trains them all, so the suite pays for spawning and importing torch once."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(cases, r, world, f"127.0.0.1:{store.port}",
                                                  str(tmp_path), device))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    return {case: [load_file(tmp_path / f"{case}-rank{r}.safetensors") for r in range(world)]
            for case in cases}


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine: the GPU variant "
    "runs on a machine with one (two gloo ranks sharing it)"))
_GROUPS: dict[str, dict[str, list[dict[str, torch.Tensor]]]] = {}


@pytest.fixture(scope="module")
def group_of_two(tmp_path_factory):
    """Every case's two-rank states on a device, trained on first use (the whole group's)."""
    def states(case: str, device: str) -> list[dict[str, torch.Tensor]]:
        if device not in _GROUPS:
            _GROUPS[device] = run_group(CASES, 2, tmp_path_factory.mktemp(f"group-{device}"),
                                        device)
        return _GROUPS[device][case]
    yield states
    _GROUPS.clear()


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("case", CASES)
def test_two_learners_at_half_batch_equal_one_learner_at_full_batch(case, device,
                                                                    group_of_two):
    single = train(case, device=device)
    ranks = group_of_two(case, device)
    for key, value in single.items():
        # every rank holds identical weights: the same bits
        assert torch.equal(ranks[0][key], ranks[1][key]), key
        # and one learner's, up to the order of float additions
        torch.testing.assert_close(ranks[0][key], value, rtol=0, atol=ATOL, msg=key)
    # the weights moved: the comparison is not between two untrained networks
    if case == "sac":
        key = "actor.net.0.weight"
        fresh_sac = SAC(SACConfig(hidden_sizes=(32, 32)), PENDULUM, seed=3)
        assert not torch.allclose(fresh_sac.state_dict()[key], single[key])
        return
    if case == "r2d2":
        fresh = R2D2(R2D2Config(lstm_size=16, hidden_sizes=(16,)), NOVEL, seed=3)
        key = "q.lstm.weight_ih_l0"
        assert not torch.allclose(fresh.state_dict()[key], single[key])
        return
    fresh = (DQN(DQNConfig(), CARTPOLE, seed=3) if case.startswith("dqn")
             else PPO(PPOConfig(), PENDULUM if case == "ppo-continuous" else CARTPOLE, seed=3))
    key = next(k for k in fresh.state_dict() if k.endswith("weight"))
    assert not torch.allclose(fresh.state_dict()[key], single[key])


def test_a_group_of_one_is_one_learner():
    """world size 1: no collective, the single learner's maths unchanged."""
    member = GroupMember("127.0.0.1", timeout_s=5)
    try:
        assert member.form(assign(generation=1, rank=0, world_size=1, store_addr=None,
                                           ranks=["l0"], publisher=True)) is None
    finally:
        member.close()


def _hang_main(store_addr: str, ready: str) -> None:
    Path(ready + ".started").write_text("")  # torch imported: the rendezvous can be quick
    member = GroupMember("127.0.0.1", timeout_s=60)
    member.form(assign(generation=1, rank=1, world_size=2, store_addr=store_addr,
                                ranks=["a", "b"], publisher=False))
    Path(ready).write_text("formed")
    time.sleep(120)  # never joins a collective: a hung rank


def test_a_collective_with_a_hung_rank_fails_after_the_timeout_and_the_group_reforms(tmp_path):
    member = GroupMember("127.0.0.1", timeout_s=3)
    ctx = mp.get_context("spawn")
    hung = ctx.Process(target=_hang_main, args=(member.store_addr, str(tmp_path / "ready")))
    hung.start()
    try:
        # rank 0 waits 3 s for rank 1 at the rendezvous too: start it once rank 1 is up (a
        # spawned process imports torch first, which takes longer on a busy machine)
        wait_for(lambda: (tmp_path / "ready.started").exists(), 60, what="rank 1 started")
        reducer = member.form(assign(generation=1, rank=0, world_size=2,
                                              store_addr=member.store_addr, ranks=["a", "b"],
                                              publisher=True))
        assert isinstance(reducer, DistReducer)
        with pytest.raises(GroupError, match="all-reduce failed"):
            reducer.sum_([torch.ones(3)])
        # re-formed alone (the next generation) it goes on
        assert member.form(assign(generation=2, rank=0, world_size=1,
                                           store_addr=member.store_addr, ranks=["a"],
                                           publisher=True)) is None
        assert member.pg is None
    finally:
        hung.kill()
        hung.join()
        member.close()


def _frozen_main(store_addr: str, ready: str, go: str, out: str) -> None:
    Path(ready + ".started").write_text("")
    member = GroupMember("127.0.0.1", timeout_s=60)
    member.form(assign(generation=1, rank=1, world_size=2, store_addr=store_addr,
                       ranks=["a", "b"], publisher=False))
    Path(ready).write_text("formed")
    while not Path(go).exists():  # frozen, until the test wakes it
        time.sleep(0.05)
    x = torch.ones(3)
    member.reducer.sum_([x])  # the all-reduce rank 0 left behind completes now
    save_file({"x": x}, out)
    member.close()


def test_a_rank_stops_waiting_for_a_hung_one_when_its_generation_ends(tmp_path):
    """The coordinator, not the collective's timeout, decides that a frozen rank is gone:
    once `ended` says the generation is over, the waiting rank leaves the all-reduce behind
    at once, re-forms without dropping the old process group on its own thread (whose
    destructor waits for the collective in flight), and when the frozen rank wakes and
    completes that all-reduce, the tensors it was given are untouched."""
    member = GroupMember("127.0.0.1", timeout_s=60)
    member.ended = lambda stalled_s: stalled_s >= 0.5
    ready, go, out = (str(tmp_path / name) for name in ("ready", "go", "x.safetensors"))
    frozen = mp.get_context("spawn").Process(target=_frozen_main,
                                             args=(member.store_addr, ready, go, out))
    frozen.start()
    try:
        wait_for(lambda: Path(ready + ".started").exists(), 60, what="rank 1 started")
        reducer = member.form(assign(generation=1, rank=0, world_size=2,
                                     store_addr=member.store_addr, ranks=["a", "b"],
                                     publisher=True))
        wait_for(lambda: Path(ready).exists(), 60, what="rank 1 formed")
        x = torch.ones(3)
        t0 = time.monotonic()
        with pytest.raises(GroupError, match="all-reduce abandoned"):
            reducer.sum_([x])
        assert time.monotonic() - t0 < 5  # not the group's 60 s timeout
        t0 = time.monotonic()
        assert member.form(assign(generation=2, rank=0, world_size=1,
                                  store_addr=member.store_addr, ranks=["a"],
                                  publisher=True)) is None
        assert time.monotonic() - t0 < 5
        assert any(t.name == "retired-process-group" for t in threading.enumerate())

        Path(go).write_text("")  # rank 1 wakes and completes the abandoned all-reduce
        frozen.join(timeout=60)
        assert frozen.exitcode == 0
        assert load_file(out)["x"].tolist() == [2.0, 2.0, 2.0]
        assert x.tolist() == [1.0, 1.0, 1.0]  # what rank 0 gave it is left alone
        wait_for(lambda: not any(t.name == "retired-process-group"
                                 for t in threading.enumerate()), 10,
                 what="the retired process group dropped")
    finally:
        frozen.kill()
        frozen.join()
        member.close()


def _state_main(store_addr: str, out: str) -> None:
    member = GroupMember("127.0.0.1", timeout_s=30)
    member.form(assign(generation=4, rank=1, world_size=2, store_addr=store_addr,
                                ranks=["a", "b"], publisher=False))
    state, version = member.broadcast_state(None, -1)
    state["version"] = torch.tensor(version)
    save_file(state, out)
    member.close()


def test_rank0_state_reaches_every_rank(tmp_path):
    member = GroupMember("127.0.0.1", timeout_s=30)
    ctx = mp.get_context("spawn")
    out = str(tmp_path / "state.safetensors")
    proc = ctx.Process(target=_state_main, args=(member.store_addr, out))
    proc.start()
    try:
        member.form(assign(generation=4, rank=0, world_size=2,
                                    store_addr=member.store_addr, ranks=["a", "b"],
                                    publisher=True))
        policy = DQN(DQNConfig(), CARTPOLE, seed=1)
        policy.learn(dqn_batches(16, False)[0])
        member.broadcast_state(policy.state_dict(), 41)
        proc.join(timeout=60)
        assert proc.exitcode == 0
    finally:
        member.close()
    got = load_file(out)
    assert int(got.pop("version")) == 41
    other = DQN(DQNConfig(), CARTPOLE, seed=99)
    other.load_state_dict(got)
    for key, value in policy.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key


def _late_main(store_addr: str, out: str) -> None:
    member = GroupMember("127.0.0.1", timeout_s=2)
    # generation 1's rendezvous fails for this rank alone (rank 0 never comes to it) ...
    with pytest.raises(GroupError, match="rendezvous of generation 1"):
        member.form(assign(generation=1, rank=1, world_size=2, store_addr=store_addr,
                           ranks=["a", "b"], publisher=False))
    # ... and generation 2 must still meet rank 0, which saw no failure
    reducer = member.form(assign(generation=2, rank=1, world_size=2, store_addr=store_addr,
                                 ranks=["a", "b"], publisher=False))
    x = torch.ones(3)
    reducer.sum_([x])
    save_file({"x": x}, out)
    member.close()


def test_a_failed_rendezvous_on_one_rank_does_not_keep_the_next_generation_apart(tmp_path):
    """torch's default group names groups by a per-process counter, so a rank that hung
    through a rendezvous would then wait under other keys than the others, for ever. Each
    generation is a group of its own on a prefixed store: the next one meets all the same."""
    member = GroupMember("127.0.0.1", timeout_s=20)
    out = str(tmp_path / "x.safetensors")
    proc = mp.get_context("spawn").Process(target=_late_main, args=(member.store_addr, out))
    proc.start()
    try:
        reducer = member.form(assign(generation=2, rank=0, world_size=2,
                                     store_addr=member.store_addr, ranks=["a", "b"],
                                     publisher=True))
        x = torch.ones(3)
        reducer.sum_([x])
        proc.join(timeout=60)
        assert proc.exitcode == 0
    finally:
        member.close()
    assert x.tolist() == [2.0, 2.0, 2.0] and load_file(out)["x"].tolist() == [2.0, 2.0, 2.0]
