"""coordinator/learner_group.py: who is in the learner group, and what each rank learns from.

Called directly here, against a real `Replay` (the coordinator's buffers); the HTTP routes
and whole clusters of learners are tested in test_learner_group_http.py and the integration
and chaos suites.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.coordinator.learner_group import (
    LearnerGroup,
    StaleGeneration,
    deal_rollout,
    shard_parts,
)
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.group import GroupSyncRequest
from rlfleet.shared.contract.wire.sampling import SampleRequest
from rlfleet.shared.replay.replay import PartPlan, Replay
from rlfleet.shared.run.config import parse_config

from .helpers import buffer_config, make_config


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def dqn_setup(batch_size: int = 64, **buffer):
    cfg = parse_config(make_config(algo={"name": "dqn", "batch_size": batch_size},
                                   buffers={"replay": buffer_config(**buffer)}))
    replay = Replay(cfg)
    replay.insert([ChunkMeta(chunk_id=f"c{i}", length=50, policy_version=0)
                   for i in range(20)], 0)
    return cfg, replay, LearnerGroup(cfg, Clock())


def ppo_setup(rollout_size: int = 300):
    cfg = parse_config(make_config(
        algo={"name": "ppo", "batch_size": 64, "rollout_size": rollout_size},
        buffers={"q": buffer_config(kind="queue", capacity=100_000)},
        learner={"mix": [{"buffer": "q", "fraction": 1.0}]}))
    return cfg, Replay(cfg), LearnerGroup(cfg, Clock())


def sync(group, replay, worker, generation=None, broken=None, port=1000):
    return group.sync(GroupSyncRequest(worker_id=worker, store_addr=f"h-{worker}:{port}",
                                       generation=generation, broken=broken), replay)


def test_each_join_starts_a_generation_survivors_keep_rank_zero():
    _, replay, group = dqn_setup()
    a = sync(group, replay, "a")
    assert (a.generation, a.rank, a.world_size, a.publisher) == (1, 0, 1, True)
    b = sync(group, replay, "b")
    assert (b.generation, b.rank, b.world_size, b.ranks) == (2, 1, 2, ["a", "b"])
    assert b.store_addr == "h-a:1000" and not b.publisher
    group.remove("a", "died", replay)
    c = sync(group, replay, "c")
    # b survived generation 3 (alone), so it is rank 0 of generation 4; c joins after it
    assert (c.generation, c.ranks, c.store_addr) == (4, ["b", "c"], "h-b:1000")
    assert [h.reason for h in group.history] == ["joined: a", "joined: b", "died: a",
                                                 "joined: c"]
    assert group.status(0.0)["reformations_by_reason"] == {"joined": 3, "died": 1}


def test_asking_again_changes_nothing_but_a_failed_collective_reforms():
    _, replay, group = dqn_setup()
    sync(group, replay, "a")
    sync(group, replay, "b")
    assert sync(group, replay, "a", generation=2).generation == 2
    # a broken report about an older generation is old news
    assert sync(group, replay, "a", generation=1, broken="timeout").generation == 2
    again = sync(group, replay, "a", generation=2, broken="all-reduce timed out")
    assert (again.generation, again.ranks) == (3, ["a", "b"])
    assert group.history[-1].reason.startswith("collective failed: a: all-reduce timed out")


def test_the_group_is_as_large_as_the_batch_splits_the_rest_stand_by():
    _, replay, group = dqn_setup(batch_size=64)
    for w in "abc":
        sync(group, replay, w)
    assert group.ranks == ["a", "b"]  # 64 does not split 3 ways
    assert sync(group, replay, "c").rank is None
    generation = group.generation
    sync(group, replay, "d")
    assert group.ranks == ["a", "b", "c", "d"] and group.generation == generation + 1
    group.remove("b", "left", replay)
    assert group.ranks == ["a", "c"]  # 3 left; 2 of them can split the batch
    assert group.status(0.0)["standby"] == ["d"]
    group.resize(1, replay)
    assert group.ranks == ["a"]


def test_a_standby_coming_or_going_leaves_the_generation_alone():
    _, replay, group = dqn_setup(batch_size=64)
    for w in "abc":
        sync(group, replay, w)
    generation = group.generation
    group.remove("c", "died", replay)
    assert group.generation == generation


def test_shards_are_disjoint_equal_and_make_up_the_batch():
    cfg, replay, group = dqn_setup(batch_size=64)
    plan = replay.plan(SampleRequest(worker_id="x", batch_size=64, num_batches=3))
    ids, parts, _ = replay.sample(plan, 3, 0, 0)
    shards = shard_parts(ids, parts, 4)
    whole = set()
    for rank_ids, rank_parts in shards:
        (p,) = rank_parts
        assert p.rows.shape == (3, 16)
        # every chunk a shard names is used by it, and indices stay inside its own list
        assert set(np.unique(p.chunk_index).tolist()) == set(range(len(rank_ids)))
        for b in range(3):
            for i in range(16):
                whole.add((b, rank_ids[p.chunk_index[b, i]], int(p.rows[b, i]),
                           int(p.item_ids[b, i])))
    (full,) = parts
    expected = {(b, ids[full.chunk_index[b, i]], int(full.rows[b, i]),
                 int(full.item_ids[b, i])) for b in range(3) for i in range(64)}
    assert whole == expected and len(expected) == len(whole)


def test_prioritized_shards_carry_their_importance_weights():
    _, replay, _ = dqn_setup(batch_size=8, kind="prioritized")
    plan = replay.plan(SampleRequest(worker_id="x", batch_size=8, num_batches=1))
    ids, parts, _ = replay.sample(plan, 1, 0, 0)
    shards = shard_parts(ids, parts, 2)
    got = np.concatenate([s[1][0].weights for s in shards], axis=1)
    assert np.array_equal(got, parts[0].weights)


def test_a_rank_asking_for_the_same_cursor_gets_the_same_shard_and_old_entries_go():
    _, replay, group = dqn_setup(batch_size=64)
    sync(group, replay, "a")
    sync(group, replay, "b")
    assert group.cached(0, 0) is None  # nothing sampled yet: the caller samples
    plan = replay.plan(SampleRequest(worker_id="a", batch_size=64, num_batches=2))
    ids, parts, _ = replay.sample(plan, 2, 0, 0)
    entry = group.add_batches(ids, parts, 2)
    assert entry.first_seq == 0 and group.log.next_seq == 2
    assert group.cached(0, 0) is entry and group.cached(1, 0) is entry  # a lost answer
    assert group.cached(0, 2) is None  # rank 0 is done with 0-1; rank 1 is not yet
    assert 0 in group.log.entries
    assert group.cached(1, 2) is None
    assert group.log.entries == {}
    with pytest.raises(StaleGeneration) as err:
        group.cached(0, 1)  # not the start of an entry: out of step
    assert err.value.field == "group_cursor"
    with pytest.raises(StaleGeneration):
        group.rank_of("a", 1)
    assert group.rank_of("b", 2) == 1


def test_rollouts_deal_whole_chunks_balanced_and_go_back_when_the_generation_ends():
    _, replay, group = ppo_setup(rollout_size=300)
    sync(group, replay, "a")
    sync(group, replay, "b")
    replay.insert([ChunkMeta(chunk_id=f"c{i}", length=n, policy_version=0)
                   for i, n in enumerate([100, 60, 80, 40, 30, 200])], 0)
    entry, dead = group.form_rollout(replay, "q", 300, 0, 0)
    assert not dead and entry is not None
    shares = [ids for ids, _ in entry.shards]
    assert sorted(shares[0] + shares[1]) == ["c0", "c1", "c2", "c3", "c4"]  # 310 rows
    rows = [sum(p[0].lengths.tolist()) for _, p in entry.shards]
    assert abs(rows[0] - rows[1]) <= 100 and sum(rows) == 310
    q = replay.buffers["q"]
    assert set(q.in_flight) == {"c0", "c1", "c2", "c3", "c4"}
    assert replay.holders["c0"] == group.holder
    # rank 0 consumed its share, then rank 1 died: its share goes back, in order
    replay.consume([type("C", (), {"buffer": "q", "chunk_ids": shares[0]})()])
    group.remove("b", "died", replay)
    assert list(q.queue)[: len(shares[1])] == sorted(shares[1], key=lambda c: int(c[1:]))
    assert not q.in_flight


def test_a_partial_rollout_waits_and_is_kept_across_requests():
    _, replay, group = ppo_setup(rollout_size=300)
    sync(group, replay, "a")
    replay.insert([ChunkMeta(chunk_id="c0", length=200, policy_version=0)], 0)
    entry, _ = group.form_rollout(replay, "q", 300, 0, 0)
    assert entry is None and replay.buffers["q"].in_flight.keys() == {"c0"}
    replay.insert([ChunkMeta(chunk_id="c1", length=200, policy_version=0)], 0)
    entry, _ = group.form_rollout(replay, "q", 300, 0, 0)
    assert entry is not None and entry.shards[0][0] == ["c0", "c1"]


def test_deal_rollout_gives_every_rank_rows_when_it_can():
    assert deal_rollout(["a", "b", "c"], [10, 10, 10], 3) == [[0], [1], [2]]
    assert deal_rollout(["a"], [10], 2) == [[0], []]
    assert deal_rollout(["a", "b", "c", "d"], [50, 10, 10, 30], 2) == [[0], [1, 2, 3]]


def test_merged_metrics_average_the_ranks_and_rates_are_per_rank():
    _, replay, group = dqn_setup()
    sync(group, replay, "a")
    sync(group, replay, "b")
    group.on_learn_info("a", 100, {"loss": 1.0, "q_mean": 4.0}, {"allreduce_ms": 0.5})
    group.clock.t = 2.0
    group.on_learn_info("a", 300, {"loss": 1.0}, {"allreduce_ms": 0.5})
    merged = group.on_learn_info("b", 300, {"loss": 3.0}, {"allreduce_ms": 0.7})
    assert merged == {"loss": 2.0}
    assert group.updates_per_s("a") == pytest.approx(100.0)
    st = group.status(0.0)
    assert st["ranks"][0] == {"rank": 0, "worker_id": "a", "updates_per_s": 100.0,
                              "allreduce_ms": 0.5}
    scalars = group.scalars()
    assert scalars["cluster/learner_group/world_size"] == 2.0
    assert scalars["cluster/learner_group/generation"] == 2.0


def test_plans_that_do_not_split_are_refused():
    _, replay, group = dqn_setup(batch_size=64)
    sync(group, replay, "a")
    sync(group, replay, "b")
    group.check_plan([PartPlan("replay", None, 64)])
    with pytest.raises(StaleGeneration, match="cannot be split"):
        group.check_plan([PartPlan("replay", None, 63)])
