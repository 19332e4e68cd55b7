"""Reward models (`shared/algos/reward_model.py`) and the built-in Random Network Distillation
(`shared/algos/rnd/model.py`): the bonus falls where the predictor trained and stays high
elsewhere, the learner trains on rewritten rewards without touching the batch it was given, the
state goes through a real checkpoint, a learner group of two takes one learner's steps, and a
wrong import path is a config error that names the field."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from rlfleet.learner.output.checkpoints import CheckpointStore
from rlfleet.local.launcher import check_config
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.ppo import PPO
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.algos.reward_model import WithRewardModel, with_reward_model
from rlfleet.shared.algos.rnd import RND
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.infra.storage import DirectoryStorage
from rlfleet.shared.run.check import check_runnable
from rlfleet.shared.run.config import load_config, parse_config
from rlfleet.single_process import run_single

MOUNTAINCAR = EnvSpec(obs_shape=(2,), n_actions=3)
RND_PATH = "rlfleet.shared.algos.rnd:RND"


def _states(n: int, low: tuple[float, float], high: tuple[float, float],
            g: torch.Generator) -> torch.Tensor:
    lo, hi = torch.tensor(low), torch.tensor(high)
    return lo + (hi - lo) * torch.rand(n, 2, generator=g)


def _batch(n: int, seed: int, spec: EnvSpec = MOUNTAINCAR) -> dict[str, torch.Tensor]:
    """MountainCar-like transitions near the valley floor, reward -1."""
    g = torch.Generator().manual_seed(seed)
    return {"obs": _states(n, (-0.6, -0.02), (-0.4, 0.02), g),
            "action": torch.randint(0, spec.n_actions, (n,), generator=g),
            "reward": -torch.ones(n), "next_obs": _states(n, (-0.6, -0.02), (-0.4, 0.02), g),
            "terminated": torch.zeros(n, dtype=torch.bool)}


def _config(tmp_path, reward_model, **algo) -> dict:
    return {"name": "rm", "env": {"id": "MountainCar-v0", "num_envs": 2},
            "algo": {"name": "dqn", "hidden_sizes": [16], "reward_model": reward_model,
                     **algo},
            "buffers": {"replay": {"rate_limit": {"min_size": 256, "samples_per_insert": 16,
                                                  "error_buffer": 4000}}},
            "eval": {"every_env_steps": 1000, "episodes": 2, "num_envs": 2,
                     "stop_value": None},
            "stop": {"max_env_steps": 1500}}


@pytest.fixture(autouse=True)
def _one_thread():
    """Small networks on a shared 2-core machine: torch's own threads only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- the bonus ---------------------------------------------------------------------------------

def test_the_predictor_learns_the_states_it_trains_on_and_not_the_others():
    rnd = RND(MOUNTAINCAR, seed=0, scale=1.0, lr=1e-3)
    g = torch.Generator().manual_seed(1)
    seen = _states(256, (-0.6, -0.02), (-0.4, 0.02), g)       # the valley floor, at rest
    novel = _states(256, (0.3, 0.04), (0.5, 0.07), g)         # up the right hill, fast
    rnd.train({"next_obs": seen})  # the observation statistics first, then the start
    before_seen = rnd.errors(seen).mean().item()
    before_novel = rnd.errors(novel).mean().item()
    for _ in range(400):
        rnd.train({"next_obs": seen[torch.randperm(256, generator=g)[:64]]})
    after_seen = rnd.errors(seen).mean().item()
    after_novel = rnd.errors(novel).mean().item()
    # the error fell on what it trained on...
    assert after_seen < before_seen / 20, (before_seen, after_seen)
    # ...and far less where it never went (some, through what the networks share)
    assert before_novel / after_novel < (before_seen / after_seen) / 10, \
        (before_seen, after_seen, before_novel, after_novel)
    assert after_novel > 50 * after_seen, (after_seen, after_novel)
    # and so the bonus: novel states earn far more of it
    assert rnd.intrinsic(novel).mean() > 50 * rnd.intrinsic(seen).mean()


def test_estimate_is_extrinsic_plus_scaled_normalised_intrinsic():
    rnd = RND(MOUNTAINCAR, seed=0, scale=0.3)
    batch = _batch(64, 0)
    for _ in range(5):
        rnd.train(batch)
    std = float(np.sqrt(rnd.int_moments.var))
    err = rnd.errors(batch["next_obs"]).detach()
    expected = batch["reward"] + 0.3 * err / std
    torch.testing.assert_close(rnd.estimate(batch), expected)
    # the observation statistics are those of every next observation trained on
    x = batch["next_obs"].double().numpy()
    np.testing.assert_allclose(rnd.obs_moments.mean, x.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rnd.obs_moments.var, x.var(axis=0), rtol=1e-6)
    assert rnd.obs_moments.count == 5 * 64


def test_the_learner_trains_on_rewritten_rewards_and_the_batch_stays_as_it_was():
    cfg = DQNConfig(hidden_sizes=(16,), reward_model={"path": RND_PATH,
                                                      "kwargs": {"scale": 2.0}})
    policy = with_reward_model(DQN(cfg, MOUNTAINCAR, seed=0), cfg, MOUNTAINCAR, 0)
    assert isinstance(policy, WithRewardModel)
    plain = DQN(cfg, MOUNTAINCAR, seed=0)
    batch = _batch(64, 3)
    original = {k: v.clone() for k, v in batch.items()}
    rewards = policy.model.estimate(batch)
    assert (rewards > batch["reward"]).all()  # a positive bonus on every row
    out = policy.learn(batch)
    for key, value in original.items():
        assert torch.equal(batch[key], value), key
    # what DQN learned from is the rewrite: the same step as a DQN given those rewards
    plain.learn({**batch, "reward": rewards})
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(policy.state_dict()[key], value, msg=key)
    assert {"reward_model/predictor_loss", "reward_model/intrinsic_mean",
            "reward_model/intrinsic_std", "reward_model/reward_mean", "loss",
            "q_mean"} <= set(out.metrics)
    assert policy.train_iterations == 1 and policy.on_policy is False
    # the acting half is the policy's own
    obs = batch["obs"].numpy()
    assert np.array_equal(policy.act_eval(obs), plain.act_eval(obs))


def test_ppo_learns_on_a_reward_model_too():
    spec = EnvSpec(obs_shape=(4,), n_actions=2)
    cfg = PPOConfig(batch_size=32, epochs=1, reward_model=RND_PATH)
    policy = with_reward_model(PPO(cfg, spec, seed=0), cfg, spec, 0)
    rng = np.random.default_rng(0)
    cut = np.zeros(64, dtype=bool)
    cut[-1] = True
    rollout = {"obs": torch.from_numpy(rng.normal(size=(64, 4)).astype(np.float32)),
               "next_obs": torch.from_numpy(rng.normal(size=(64, 4)).astype(np.float32)),
               "action": torch.from_numpy(rng.integers(0, 2, 64)),
               "reward": torch.ones(64), "terminated": torch.zeros(64, dtype=torch.bool),
               "cut": torch.from_numpy(cut), "log_prob": torch.full((64,), -0.7),
               "value": torch.zeros(64), "bootstrap_value": torch.zeros(64)}
    out = policy.learn(rollout)
    assert policy.train_iterations == 2 and "reward_model/intrinsic_mean" in out.metrics
    assert policy.model.obs_moments.count == 64
    # a rank's empty share of a group's rollout passes through, and still trains (nothing)
    policy.learn({})
    assert policy.model.obs_moments.count == 64


# -- checkpoints ------------------------------------------------------------------------------

def test_the_reward_model_goes_through_a_checkpoint_and_training_continues_alike(tmp_path):
    cfg = DQNConfig(hidden_sizes=(16,), reward_model={"path": RND_PATH,
                                                      "kwargs": {"scale": 0.5}})

    def build(seed: int) -> WithRewardModel:
        return with_reward_model(DQN(cfg, MOUNTAINCAR, seed=seed), cfg, MOUNTAINCAR, seed)

    trained = build(0)
    for i in range(30):
        trained.learn(_batch(32, i))
    store = CheckpointStore(DirectoryStorage(tmp_path), "ckpt", 2, {"run": "t"})
    store.save(trained.state_dict(), trained.train_iterations, 3)

    restored = build(7)  # other seeds: nothing may survive by coincidence
    state, meta = CheckpointStore(DirectoryStorage(tmp_path), "ckpt", 2).latest()
    assert meta["train_iterations"] == "30"
    assert any(k.startswith("reward_model.predictor.") for k in state)
    restored.load_state_dict(state)
    for key, value in trained.state_dict().items():
        assert torch.equal(restored.state_dict()[key], value), key
    assert restored.model.obs_moments.count == trained.model.obs_moments.count == 30 * 32
    probe = _batch(16, 99)
    assert torch.equal(restored.model.estimate(probe), trained.model.estimate(probe))
    for i in range(30, 35):
        trained.learn(_batch(32, i))
        restored.learn(_batch(32, i))
    for key, value in trained.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[key], value, rtol=0, atol=0,
                                   msg=key)


def test_a_checkpoint_without_the_reward_model_is_refused():
    cfg = DQNConfig(hidden_sizes=(16,), reward_model=RND_PATH)
    policy = with_reward_model(DQN(cfg, MOUNTAINCAR, seed=0), cfg, MOUNTAINCAR, 0)
    with pytest.raises(ValueError, match="no reward model state"):
        policy.load_state_dict(DQN(cfg, MOUNTAINCAR, seed=0).state_dict())


# -- a learner group -------------------------------------------------------------------------

class _Shared:
    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: list[list[torch.Tensor] | None] = [None] * world


class ThreadReducer:
    """The `Reducer` contract between threads: every rank sums in the same order, so all
    get the same bits, as gloo's all-reduce gives them."""

    def __init__(self, shared: _Shared, rank: int, world: int) -> None:
        self.shared, self.rank, self.world_size = shared, rank, world

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        self.shared.slots[self.rank] = [t.detach().clone() for t in tensors]
        self.shared.barrier.wait()
        totals = [sum(slot[i] for slot in self.shared.slots) for i in range(len(tensors))]
        self.shared.barrier.wait()
        for t, total in zip(tensors, totals, strict=True):
            t.copy_(total)


def test_two_ranks_at_half_batch_take_one_learners_steps():
    cfg = DQNConfig(hidden_sizes=(16,), target_update_every=5,
                    reward_model={"path": RND_PATH, "kwargs": {"scale": 0.5}})
    batches = [_batch(64, i) for i in range(20)]

    def build() -> WithRewardModel:
        # here, not in the rank threads: DQN seeds torch's global generator as it builds
        return with_reward_model(DQN(cfg, MOUNTAINCAR, seed=3), cfg, MOUNTAINCAR, 3)

    def train(policy, rank: int, world: int, reducer) -> dict[str, torch.Tensor]:
        policy.set_reducer(reducer)
        shard = 64 // world
        for b in batches:
            policy.learn({k: v[rank * shard:(rank + 1) * shard] for k, v in b.items()})
        return policy.state_dict()

    one = train(build(), 0, 1, None)
    shared, results, policies = _Shared(2), [None, None], [build(), build()]

    def rank_main(rank: int) -> None:
        results[rank] = train(policies[rank], rank, 2, ThreadReducer(shared, rank, 2))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results[0] is not None and results[1] is not None
    for key, value in one.items():
        assert torch.equal(results[0][key], results[1][key]), key
        torch.testing.assert_close(results[0][key].double(), value.double(), rtol=0,
                                   atol=1e-5, msg=key)
    assert float(one["reward_model.obs_moments.count"]) == 20 * 64


def test_a_reward_model_without_set_reducer_is_refused_for_a_group(tmp_path):
    cfg = parse_config(_config(tmp_path, "tests.unit.test_reward_model:Constant",
                               batch_size=64) | {"learner": {"count": 2}})
    with pytest.raises(ConfigError, match=r"algo\.reward_model=.*set_reducer"):
        check_runnable(cfg)


class Constant:
    """A reward model of the smallest kind: every reward becomes `value`."""

    def __init__(self, spec: EnvSpec, seed: int = 0, value: float = 1.0) -> None:
        self.value = value

    def estimate(self, batch):
        return torch.full_like(batch["reward"], self.value, dtype=torch.float32)

    def train(self, batch):
        return {}

    def state_dict(self):
        return {"value": torch.tensor(self.value)}

    def load_state_dict(self, state):
        self.value = float(state["value"])


# -- the config ------------------------------------------------------------------------------

def test_the_config_takes_a_mapping_or_a_bare_path(tmp_path):
    full = parse_config(_config(tmp_path, {"path": RND_PATH, "kwargs": {"scale": 0.2}}))
    assert full.algo.reward_model.path == RND_PATH
    assert full.algo.reward_model.kwargs == {"scale": 0.2}
    bare = parse_config(_config(tmp_path, RND_PATH))
    assert bare.algo.reward_model.path == RND_PATH and bare.algo.reward_model.kwargs == {}
    assert parse_config(_config(tmp_path, None)).algo.reward_model is None
    with pytest.raises(ConfigError, match=r"field 'algo\.reward_model\.path'"):
        parse_config(_config(tmp_path, "rlfleet.shared.algos.rnd.RND"))
    with pytest.raises(ConfigError, match=r"field 'algo\.reward_model\.scale'"):
        parse_config(_config(tmp_path, {"path": RND_PATH, "scale": 1.0}))


@pytest.mark.parametrize("path, says", [
    ("rlfleet.shared.algos.rnd:Nope", r"algo\.reward_model='rlfleet\.shared\.algos\.rnd:Nope': "
                                      r"module 'rlfleet\.shared\.algos\.rnd' has no attribute "
                                      r"'Nope'"),
    ("no_such_pkg.rnd:RND", r"algo\.reward_model='no_such_pkg\.rnd:RND': cannot import "
                            r"module 'no_such_pkg\.rnd'"),
    ("rlfleet.shared.algos.rnd.model:np",
     r"algo\.reward_model='rlfleet\.shared\.algos\.rnd\.model:np' is not a reward model "
     r"class"),
])
def test_a_bad_import_path_is_a_config_error_naming_the_field(tmp_path, path, says):
    cfg = parse_config(_config(tmp_path, path))
    with pytest.raises(ConfigError, match=says):
        check_runnable(cfg)


def test_bad_kwargs_are_a_config_error_naming_the_field(tmp_path):
    cfg = parse_config(_config(tmp_path, {"path": RND_PATH, "kwargs": {"sclae": 1.0}}))
    with pytest.raises(ConfigError, match=r"algo\.reward_model\.kwargs: .*sclae"):
        check_runnable(cfg)
    cfg = parse_config(_config(tmp_path, {"path": RND_PATH, "kwargs": {"scale": -1}}))
    with pytest.raises(ConfigError, match=r"algo\.reward_model\.kwargs: .*scale=-1"):
        check_runnable(cfg)


def test_rlfleet_up_refuses_a_bad_path_at_launch(tmp_path):
    """The launcher checks a config naming code in a `rlfleet check` child: its error is the
    launcher's, naming the field, before anything starts."""
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path, "rlfleet.shared.algos.rnd:RNDD")))
    with pytest.raises(ConfigError,
                       match=r"algo\.reward_model='rlfleet\.shared\.algos\.rnd:RNDD'"):
        check_config(load_config(path), path)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_config(tmp_path, RND_PATH)))
    check_config(load_config(good), good)


def test_the_single_process_runner_trains_with_it(tmp_path):
    cfg = parse_config(_config(tmp_path, {"path": RND_PATH, "kwargs": {"scale": 0.5}}))
    res = run_single(cfg)
    assert res.env_steps >= 1500 and res.train_iterations > 0
