"""The learner's batch transforms (`shared/batching/transforms.py`): n-step returns against hand
computations (episode ends, time limits, chunk cuts, a chunk boundary), with frames stored
once, masks and prioritized parts; hindsight relabelling on the bit-flipping env; per-buffer
rewards; and the same batches from the learner's data process."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlfleet.learner.feed.dataproc import DataProcess
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.batching.batching import assemble, assemble_from
from rlfleet.shared.batching.transforms import BatchTransforms
from rlfleet.shared.contract.config import EnvConfig
from rlfleet.shared.contract.frames import pack, unpack
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.envs.make import env_spec
from rlfleet.shared.run.config import parse_config

from .helpers import collector_and_learner, make_config, ok, report, wait_for


def _part(rows, chunk_index=None, buffer="replay", weights=None, item_ids=None):
    rows = np.asarray(rows, dtype=np.int64).reshape(1, -1)
    return SimpleNamespace(
        buffer=buffer, key=None, rows=rows.tolist(),
        chunk_index=(np.zeros_like(rows) if chunk_index is None
                     else np.asarray(chunk_index).reshape(1, -1)).tolist(),
        item_ids=(rows if item_ids is None else np.asarray(item_ids).reshape(1, -1)).tolist(),
        weights=weights, sequence_length=None)


def _chunk(rewards, terminated, truncated, cut, obs_dim=2):
    n = len(rewards)
    obs = np.zeros((n, obs_dim), np.float32)
    obs[:, 0] = np.arange(n)
    next_obs = obs.copy()
    next_obs[:, 0] += 0.5  # row i's next_obs says i + 0.5
    return {"obs": obs, "action": np.zeros(n, np.int64),
            "reward": np.asarray(rewards, np.float32), "next_obs": next_obs,
            "terminated": np.asarray(terminated, bool), "truncated": np.asarray(truncated, bool),
            "cut": np.asarray(cut, bool)}


# Two envs of 5 rows each, env-major. Env 0: an episode terminates at row 2, the next one
# runs on past the chunk's end (row 4 is cut by the chunk). Env 1: a time limit truncates
# at row 6, the next episode is cut by the chunk at row 9.
CHUNK = _chunk(rewards=[1, 2, 3, 4, 5, 10, 11, 12, 13, 14],
               terminated=[0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
               truncated=[0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
               cut=[0, 0, 1, 0, 1, 0, 1, 0, 0, 1])
# By hand, n = 3, gamma = 0.5: (return, rows summed m, next_obs row, terminated)
HAND = {0: (1 + .5 * 2 + .25 * 3, 3, 2, True),   # stops at the terminal row
        1: (2 + .5 * 3, 2, 2, True),
        2: (3, 1, 2, True),
        3: (4 + .5 * 5, 2, 4, False),             # the chunk's cut: bootstrap with 0.5^2
        4: (5, 1, 4, False),
        5: (10 + .5 * 11, 2, 6, False),           # the time limit: bootstrap from row 6
        6: (11, 1, 6, False),
        7: (12 + .5 * 13 + .25 * 14, 3, 9, False),
        8: (13 + .5 * 14, 2, 9, False),
        9: (14, 1, 9, False)}


def _check_hand(data, rows, offset=0):
    for i, row in enumerate(rows):
        ret, m, last, term = HAND[row]
        assert float(data["reward"][i]) == pytest.approx(ret), row
        assert float(data["discount"][i]) == pytest.approx(0.5 ** m), row
        assert float(data["next_obs"][i, 0]) == last + offset + 0.5, row
        assert bool(data["terminated"][i]) is term, row
        assert float(data["obs"][i, 0]) == row + offset  # obs stays the sampled row's


def test_n_step_returns_match_a_hand_computation():
    t = BatchTransforms(n_step=3, gamma=0.5)
    rows = list(range(10))
    [batch] = assemble([CHUNK], [_part(rows)], 1, transforms=t)
    assert set(batch.data) >= {"obs", "action", "reward", "next_obs", "terminated", "discount"}
    assert batch.data["reward"].dtype == torch.float32
    assert batch.data["discount"].dtype == torch.float32
    _check_hand(batch.data, rows)


def test_n_step_never_crosses_a_chunk_boundary():
    """The second chunk's rows continue the first's in memory, but the first's last rows
    are cuts: nothing is summed across."""
    second = _chunk([100] * 10, [0] * 10, [0] * 10, [0, 0, 0, 0, 1, 0, 0, 0, 0, 1])
    t = BatchTransforms(n_step=3, gamma=0.5)
    parts = [_part([3, 4, 8, 9, 0], chunk_index=[0, 0, 0, 0, 1])]
    [batch] = assemble([CHUNK, second], parts, 1, transforms=t)
    _check_hand(batch.data, [3, 4, 8, 9])
    assert float(batch.data["reward"][4]) == pytest.approx(100 + 50 + 25)
    assert float(batch.data["next_obs"][4, 0]) == 2.5  # second chunk's row 2


def test_n_step_in_an_arena_layout_with_gaps_between_slots():
    """`assemble_from` over a ChunkArena's columns: slots longer than their chunks hold
    garbage after each chunk's last row, which a run's cut keeps out of every sum."""
    slot = 16
    cols = {k: np.empty((2 * slot, *v.shape[1:]), v.dtype) for k, v in CHUNK.items()}
    for k in cols:
        cols[k][:] = np.nan if cols[k].dtype.kind == "f" else 1  # poison the gaps
        cols[k][:10] = CHUNK[k]
        cols[k][slot:slot + 10] = CHUNK[k]
    t = BatchTransforms(n_step=3, gamma=0.5)
    offsets = np.array([0, slot])
    [batch] = assemble_from(cols, offsets, [_part([4, 9, 7], chunk_index=[1, 1, 0])], 1,
                            transforms=t)
    assert np.isfinite(batch.data["reward"].numpy()).all()
    for i, row in enumerate([4, 9, 7]):
        assert float(batch.data["reward"][i]) == pytest.approx(HAND[row][0])


def test_one_step_is_the_stored_row_and_adds_no_field():
    t = BatchTransforms(n_step=1, gamma=0.5)
    assert not t.active
    [plain] = assemble([CHUNK], [_part(range(10))], 1)
    [same] = assemble([CHUNK], [_part(range(10))], 1, transforms=t)
    assert set(same.data) == set(plain.data) and "discount" not in same.data
    for f in plain.data:
        assert torch.equal(plain.data[f], same.data[f])


def test_n_step_with_frames_stored_once_and_masks():
    """Atari-style chunks: next_obs is rebuilt from frames at the last row used; the next
    action mask comes from that row too."""
    n, stack = 10, 2
    frame = np.arange(n + stack, dtype=np.uint8)  # frame t is all t
    obs = np.stack([np.stack([np.full((3, 3), frame[i + s]) for s in range(stack)])
                    for i in range(n)])
    next_obs = np.stack([np.stack([np.full((3, 3), frame[i + 1 + s]) for s in range(stack)])
                         for i in range(n)])
    chunk = dict(CHUNK)
    chunk["obs"], chunk["next_obs"] = obs, next_obs
    chunk["action_mask"] = (np.arange(n)[:, None] >> np.arange(4) & 1).astype(bool)
    chunk["next_action_mask"] = ~chunk["action_mask"]
    packed = pack(chunk)
    assert "frames" in packed and "next_obs" not in packed
    t = BatchTransforms(n_step=3, gamma=0.5)
    fields = ("obs", "action", "reward", "next_obs", "terminated", "action_mask",
              "next_action_mask")
    rows = [0, 3, 5, 7]
    [batch] = assemble([packed], [_part(rows)], 1, fields=fields, transforms=t)
    full = unpack(packed)
    for i, row in enumerate(rows):
        last = HAND[row][2]
        assert np.array_equal(batch.data["next_obs"][i].numpy(), full["next_obs"][last])
        assert np.array_equal(batch.data["obs"][i].numpy(), full["obs"][row])
        assert np.array_equal(batch.data["next_action_mask"][i].numpy(),
                              chunk["next_action_mask"][last])
        assert np.array_equal(batch.data["action_mask"][i].numpy(), chunk["action_mask"][row])
        assert float(batch.data["reward"][i]) == pytest.approx(HAND[row][0])


def test_prioritized_parts_keep_their_sampled_rows_ids_and_weights():
    t = BatchTransforms(n_step=3, gamma=0.5)
    part = _part([0, 7, 3], weights=[[0.5, 1.0, 0.25]], item_ids=[11, 17, 13])
    [batch] = assemble([CHUNK], [part], 1, transforms=t)
    [(buffer, ids, where)] = batch.item_refs
    assert buffer == "replay" and ids.tolist() == [11, 17, 13] and where == slice(0, 3)
    assert batch.weights.tolist() == [0.5, 1.0, 0.25]


def test_dqn_bootstraps_with_the_batch_discount():
    spec = EnvSpec(obs_shape=(2,), n_actions=3)
    dqn = DQN(DQNConfig(gamma=0.9, hidden_sizes=(8,)), spec, 0)
    batch = {"obs": torch.zeros(3, 2), "next_obs": torch.ones(3, 2),
             "action": torch.zeros(3, dtype=torch.int64),
             "reward": torch.tensor([1.0, 2.0, 3.0]),
             "terminated": torch.tensor([False, False, True]),
             "discount": torch.tensor([0.5, 0.25, 0.125])}
    with torch.no_grad():
        next_q = dqn.target(batch["next_obs"])[:, dqn.q(batch["next_obs"]).argmax(1)[0]]
    _, target = dqn._q_and_target(dqn.q(batch["obs"]), batch)
    expected = batch["reward"] + batch["discount"] * torch.tensor([1.0, 1.0, 0.0]) * next_q
    assert torch.allclose(target, expected)
    del batch["discount"]  # one-step batches: gamma
    _, target = dqn._q_and_target(dqn.q(batch["obs"]), batch)
    assert torch.allclose(target, batch["reward"] + 0.9 * torch.tensor([1.0, 1.0, 0.0])
                          * next_q)


def test_cql_inherits_the_n_step_target():
    from rlfleet.shared.algos.cql import CQL
    from rlfleet.shared.algos.cql.config import CQLConfig

    spec = EnvSpec(obs_shape=(2,), n_actions=3)
    t = BatchTransforms(n_step=3, gamma=0.5)
    [batch] = assemble([CHUNK], [_part(range(10))], 1, transforms=t)
    cql = CQL(CQLConfig(gamma=0.5, n_step=3, hidden_sizes=(8,)), spec, 0)
    with torch.no_grad():
        q_next = cql.target(batch.data["next_obs"]).gather(
            1, cql.q(batch.data["next_obs"]).argmax(1, keepdim=True)).squeeze(1)
        q, target = cql._q_and_target(cql.q(batch.data["obs"]), batch.data)
    not_done = 1.0 - batch.data["terminated"].float()
    assert torch.allclose(target, batch.data["reward"] + batch.data["discount"] * not_done
                          * q_next)
    out = cql.learn(batch.data)
    assert torch.allclose(out.priorities, (target - q).abs())


def test_the_config_fields_and_their_errors():
    from rlfleet.shared.contract.config import ConfigError

    cfg = parse_config(make_config(algo={"n_step": 3, "her": {"strategy": "final", "k": 2}}))
    assert cfg.algo.n_step == 3 and (cfg.algo.her.strategy, cfg.algo.her.k) == ("final", 2)
    assert parse_config(make_config()).algo.n_step == 1 and parse_config(
        make_config()).algo.her is None
    for algo, field in (({"n_step": 0}, "algo.n_step"), ({"her": {"strategy": "next"}},
                                                           "algo.her.strategy")):
        with pytest.raises(ConfigError, match=field):
            parse_config(make_config(algo=algo))
    with pytest.raises(ConfigError, match="learner.mix.0.reward"):
        parse_config(make_config(learner={"mix": [{"buffer": "replay", "fraction": 1.0,
                                                   "reward": "high"}]}))


# -- per-buffer rewards (SQIL) --------------------------------------------------------------

def test_a_mix_entrys_reward_overrides_its_part_only():
    cfg = parse_config(make_config(
        buffers={"replay": {"kind": "uniform"}, "expert": {"kind": "uniform"}},
        learner={"mix": [{"buffer": "replay", "fraction": 0.5, "reward": 0.0},
                         {"buffer": "expert", "fraction": 0.5, "reward": 1.0}]}))
    t = BatchTransforms.from_config(cfg)
    assert t.rewards == {"replay": 0.0, "expert": 1.0} and t.n_step == 1
    parts = [_part([0, 1, 2]), _part([5, 6], buffer="expert", chunk_index=[1, 1])]
    [batch] = assemble([CHUNK, CHUNK], parts, 1, transforms=t)
    assert batch.data["reward"].tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert "discount" not in batch.data
    # with n-step, every summed row has the buffer's reward: 1 + 0.5 = 1.5 for row 5
    t3 = BatchTransforms(n_step=3, gamma=0.5, rewards={"expert": 1.0})
    [batch] = assemble([CHUNK, CHUNK], parts, 1, transforms=t3)
    assert batch.data["reward"][3:].tolist() == [1.5, 1.0]
    assert batch.data["reward"][:3].tolist() == pytest.approx([HAND[r][0] for r in (0, 1, 2)])


# -- hindsight relabelling -------------------------------------------------------------------

BITS = 6
BITFLIP = EnvConfig(id="rlfleet/BitFlip-v0", kwargs={"n_bits": BITS})


def _bitflip_chunk(episodes: int = 6, seed: int = 0):
    """Whole bit-flipping episodes of random actions, as an episodes-mode chunk."""
    import gymnasium as gym

    from rlfleet.shared.envs.goals import FlattenGoalObs

    env = FlattenGoalObs(gym.make("rlfleet/BitFlip-v0", n_bits=BITS))
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in CHUNK}
    for e in range(episodes):
        obs, _ = env.reset(seed=seed * 100 + e)
        done = False
        while not done:
            a = int(rng.integers(BITS))
            nxt, r, term, trunc, _ = env.step(a)
            done = term or trunc
            for k, v in (("obs", obs), ("action", a), ("reward", r), ("next_obs", nxt),
                         ("terminated", term), ("truncated", trunc), ("cut", done)):
                cols[k].append(v)
            obs = nxt
    out = {k: np.asarray(v) for k, v in cols.items()}
    out["reward"] = out["reward"].astype(np.float32)
    return out


def _her(strategy: str, k: int = 4, **kw) -> BatchTransforms:
    spec = env_spec(BITFLIP)
    assert spec.goal is not None
    return BatchTransforms(gamma=0.9, her={
        "strategy": strategy, "k": k, "achieved_goal": list(spec.goal.achieved_goal),
        "desired_goal": list(spec.goal.desired_goal),
        "env": BITFLIP.model_dump(mode="json")}, seed=3, **kw)


def test_the_bitflip_spec_records_where_the_goal_parts_lie():
    spec = env_spec(BITFLIP)
    assert spec.obs_shape == (3 * BITS,) and spec.n_actions == BITS
    assert (spec.goal.observation, spec.goal.achieved_goal, spec.goal.desired_goal) == (
        (0, BITS), (BITS, 2 * BITS), (2 * BITS, 3 * BITS))


@pytest.mark.parametrize("strategy", ["future", "final"])
def test_her_relabels_with_a_later_achieved_goal_of_the_same_run(strategy):
    chunk = _bitflip_chunk()
    t = _her(strategy)
    n = len(chunk["reward"])
    run_end = np.array([np.flatnonzero(chunk["cut"][i:])[0] + i for i in range(n)])
    rows = np.tile(np.arange(n), 40)
    [batch] = assemble([chunk], [_part(rows)], 1, transforms=t)
    d = {k: v.numpy() for k, v in batch.data.items()}
    ach, des = slice(BITS, 2 * BITS), slice(2 * BITS, 3 * BITS)
    relabelled = (d["obs"][:, des] != chunk["obs"][rows][:, des]).any(axis=1)
    # a goal equal to the original is relabelled invisibly: about k/(k+1) = 0.8 differ
    assert 0.6 < relabelled.mean() < 0.85
    for i in np.flatnonzero(relabelled)[:200]:
        r, goal = rows[i], d["obs"][i, des]
        assert np.array_equal(d["next_obs"][i, des], goal)  # obs and next_obs alike
        later = [g for g in range(r, run_end[r] + 1)
                 if np.array_equal(chunk["next_obs"][g, ach], goal)]
        assert later, "the goal was achieved later in the run"
        if strategy == "final":
            assert np.array_equal(goal, chunk["next_obs"][run_end[r], ach])
        reached = np.array_equal(chunk["next_obs"][r, ach], goal)
        assert d["reward"][i] == (0.0 if reached else -1.0)
        assert d["terminated"][i] == reached  # bit flipping ends on its goal
    kept = ~relabelled
    assert np.array_equal(d["reward"][kept], chunk["reward"][rows][kept])
    assert np.array_equal(d["next_obs"][kept], chunk["next_obs"][rows][kept])
    # the rest of the observation is never touched
    assert np.array_equal(d["obs"][:, :2 * BITS], chunk["obs"][rows][:, :2 * BITS])


def test_her_future_draws_the_current_step_and_the_runs_end_too():
    """A row's own next state is a 'future' goal: relabelled with it, the step succeeds,
    the signal HER lives on."""
    chunk = _bitflip_chunk()
    t = _her("future", k=64)
    rows = np.zeros(2000, dtype=np.int64)
    [batch] = assemble([chunk], [_part(rows)], 1, transforms=t)
    assert 0.0 in batch.data["reward"].tolist() and -1.0 in batch.data["reward"].tolist()


def test_her_with_n_step_recomputes_every_summed_reward():
    chunk = _bitflip_chunk()
    t = _her("final", k=64, n_step=2)
    rows = np.flatnonzero(~chunk["cut"])  # rows with a next row in their run
    [batch] = assemble([chunk], [_part(np.tile(rows, 5))], 1, transforms=t)
    d = {k: v.numpy() for k, v in batch.data.items()}
    ach, des = slice(BITS, 2 * BITS), slice(2 * BITS, 3 * BITS)
    for i, r in enumerate(np.tile(rows, 5)):
        goal = d["obs"][i, des]
        r0 = 0.0 if np.array_equal(chunk["next_obs"][r, ach], goal) else -1.0
        if r0 == 0.0:  # reaching the goal ends the sum there
            assert d["reward"][i] == 0.0 and d["discount"][i] == pytest.approx(0.9)
            continue
        r1 = 0.0 if np.array_equal(chunk["next_obs"][r + 1, ach], goal) else -1.0
        assert d["reward"][i] == pytest.approx(r0 + 0.9 * r1)
        assert d["discount"][i] == pytest.approx(0.81)
        assert np.array_equal(d["next_obs"][i, :2 * BITS], chunk["next_obs"][r + 1, :2 * BITS])


def test_her_needs_a_goal_env():
    cfg = parse_config(make_config(algo={"her": {"strategy": "future", "k": 4}}))
    with pytest.raises(ValueError, match="algo.her"):
        BatchTransforms.from_config(cfg)
    with pytest.raises(ValueError, match="algo.her"):
        DQN(cfg.algo, EnvSpec(obs_shape=(4,), n_actions=2), 0)


# -- the data process ------------------------------------------------------------------------

def test_the_data_process_hands_over_n_step_batches(coordinator, task_sink):
    """Chunks whose rows say who they are: every batch row's return, discount and next_obs
    are the hand computation's for that row."""
    from rlfleet.shared.contract.codec import encode_arrays
    from rlfleet.shared.infra.storage.directory import DirectoryStorage

    c = coordinator()
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    store = DirectoryStorage(c.storage_dir)
    chunks = []
    for _ in range(30):  # 300 rows: past the buffer's min_size
        chunk_id = uuid.uuid4().hex
        store.put_chunk(chunk_id, encode_arrays(CHUNK, {"policy_version": "-1"}))
        chunks.append((chunk_id, 10))
    ok(report(c, col["worker_id"], collect["task_id"], chunks))
    t = BatchTransforms(n_step=3, gamma=0.5)
    dp = DataProcess(c.url, str(c.storage_dir), "run", lrn["worker_id"], batch_size=16,
                     batches_per_request=2, depth=1, cache_size=64, transforms=t).start()
    try:
        batches = wait_for(lambda: dp.get(timeout=1.0), what="an answer's batches")
        for batch in batches:
            d = batch.data
            assert "discount" in d
            rows = d["obs"][:, 0].numpy().astype(int).tolist()
            _check_hand(d, rows)
    finally:
        dp.close()
    assert dp._proc is not None and dp._proc.returncode == 0


def test_her_on_an_env_without_goals_is_refused_at_launch_naming_the_field():
    """`rlfleet up` checks without building the policy (no torch): the env's spec says it
    has no goals, so the run never starts its workers."""
    from rlfleet.shared.contract.config import ConfigError
    from rlfleet.shared.run.check import check_runnable

    cfg = parse_config(make_config(algo={"her": {"strategy": "future", "k": 4}}))
    with pytest.raises(ConfigError, match=r"algo.her: .*goal-conditioned"):
        check_runnable(cfg, build=False)
    goal = parse_config(make_config(algo={"her": {"strategy": "future", "k": 4}},
                                    env={"id": "rlfleet/BitFlip-v0", "kwargs": {"n_bits": 5},
                                         "num_envs": 2}))
    check_runnable(goal, build=False)
