"""shared/replay/replay.py (Replay): several buffers behind one coordinator.

The first half calls `Replay` directly: how a learner's mix splits a batch, how chunks shared
by buffers are released, that feedback is checked before anything changes, and a snapshot
round trip. The second half runs real coordinator processes (`python -m rlfleet
coordinator`) and talks to them over HTTP as collectors and learners do, with chunks in a
real storage directory.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import numpy as np
import pytest
import requests

from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.sampling import Consumed, MixShare, PriorityUpdate, SampleRequest
from rlfleet.shared.infra.storage import DirectoryStorage
from rlfleet.shared.infra.webapp import BadRequest
from rlfleet.shared.replay.replay import Replay, UnknownBuffer
from rlfleet.shared.run.config import parse_config

from .helpers import (
    HTTP,
    TIMEOUT,
    CoordinatorProc,
    buffer_config,
    collector_and_learner,
    get,
    make_config,
    ok,
    post,
    prewarm_module,
    register,
    report,
    wait_for,
    write_chunk,
)

FREE = {"min_size": 1}  # a rate limit that only waits for a first item


def replay(buffers: dict, mix: list[tuple[str, float]] | None = None, **sections) -> Replay:
    """A Replay on the test config with these buffers; the learner's mix defaults to all of
    the first one."""
    mix = mix or [(next(iter(buffers)), 1.0)]
    sections["learner"] = {"mix": [{"buffer": b, "fraction": f} for b, f in mix]}
    return Replay(parse_config(make_config(buffers=buffers, **sections)))


def meta(chunk_id: str, length: int, version: int = 0) -> ChunkMeta:
    return ChunkMeta(chunk_id=chunk_id, length=length, policy_version=version)


def request(batch_size: int, num_batches: int = 1, mix=None, by_buffer=None) -> SampleRequest:
    return SampleRequest(
        worker_id="learner-1", batch_size=batch_size, num_batches=num_batches,
        mix=None if mix is None else [MixShare(buffer=b, fraction=f) for b, f in mix],
        by_buffer=by_buffer)


THREE = {name: buffer_config(rate_limit=FREE) for name in ("a", "b", "c")}


# -- the learner's mix ------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size,mix,sizes", [
    (7, [("a", 0.6), ("b", 0.4)], {"a": 4, "b": 3}),                  # 4.2 + 2.8
    (5, [("a", 0.15), ("b", 0.15), ("c", 0.7)], {"a": 1, "b": 1, "c": 3}),  # rounding: 1+1+4
    (10, [("a", 0.34), ("b", 0.33), ("c", 0.33)], {"a": 4, "b": 3, "c": 3}),
    (64, [("a", 0.25), ("c", 0.75)], {"a": 16, "c": 48}),
    (2, [("a", 0.1), ("b", 0.9)], {"b": 2}),                          # a's 0.2 item: no part
])
def test_a_mix_splits_each_batch_by_largest_remainder(batch_size, mix, sizes):
    r = replay(THREE)
    plan = r.plan(request(batch_size, mix=mix))
    assert {p.buffer: p.batch_size for p in plan} == sizes
    assert sum(p.batch_size for p in plan) == batch_size
    assert [p.buffer for p in plan] == [b for b, _ in mix if b in sizes]  # in the mix's order
    assert all(p.key is None for p in plan)


def test_without_a_mix_the_configured_one_is_used_and_by_buffer_gives_one_part_per_key():
    r = replay(THREE, mix=[("c", 0.5), ("a", 0.5)])
    assert [(p.buffer, p.batch_size) for p in r.plan(request(9))] == [("c", 5), ("a", 4)]
    plan = r.plan(request(1, by_buffer={"b": 3, "a": 5}))
    assert [(p.buffer, p.key, p.batch_size) for p in plan] == [("b", "b", 3), ("a", "a", 5)]


@pytest.mark.parametrize("req,field", [
    (request(8, mix=[("a", 0.5), ("zzz", 0.5)]), "mix.1.buffer"),
    (request(8, by_buffer={"a": 4, "zzz": 4}), "by_buffer.zzz"),
])
def test_an_unknown_buffer_names_the_field(req, field):
    with pytest.raises(UnknownBuffer) as info:
        replay(THREE).plan(req)
    assert info.value.field == field and "'zzz'" in str(info.value)


def test_mix_samples_compose_every_batch_from_each_buffer_in_its_share():
    """"recent" only samples the newest 16 items, so its part is told apart from "all"."""
    r = replay({"all": buffer_config(rate_limit=FREE),
                "recent": buffer_config(sample_range=16, rate_limit=FREE)},
               mix=[("all", 0.7), ("recent", 0.3)])
    lengths = {"c0": 50, "c1": 30, "c2": 40}
    fresh, dead = r.insert([meta(c, n) for c, n in lengths.items()], 0)
    assert len(fresh) == 3 and dead == []
    plan = r.plan(request(10))
    assert r.grantable(plan, 50) == 50
    chunk_ids, parts, dead = r.sample(plan, 50, train_iteration=0, policy_version=0)
    assert dead == [] and len(chunk_ids) == len(set(chunk_ids)) == 3
    every, recent = parts
    assert (every.buffer, recent.buffer) == ("all", "recent")
    assert every.item_ids.shape == every.rows.shape == every.chunk_index.shape == (50, 7)
    assert recent.item_ids.shape == (50, 3)
    assert set(recent.item_ids.ravel().tolist()) <= set(range(104, 120))
    assert recent.item_ids.min() >= 104 and every.item_ids.min() < 104
    # both parts index the response's one chunk list, and their rows resolve to item ids
    first_uid = {"c0": 0, "c1": 50, "c2": 80}
    for part in parts:
        names = np.array(chunk_ids)[part.chunk_index]
        starts = np.vectorize(first_uid.get)(names)
        np.testing.assert_array_equal(part.item_ids, starts + part.rows)
        assert (part.rows < np.vectorize(lengths.get)(names)).all()
    assert set(np.array(chunk_ids)[recent.chunk_index].ravel()) == {"c2"}
    stats = r.stats()
    assert stats["all"]["sampled_items"] == 350 and stats["recent"]["sampled_items"] == 150


def test_a_mix_is_granted_only_what_every_part_allows():
    r = replay({"a": buffer_config(rate_limit=FREE),
                "b": buffer_config(rate_limit={"min_size": 100, "samples_per_insert": 1.0,
                                               "error_buffer": 40})},
               mix=[("a", 0.5), ("b", 0.5)])
    plan = r.plan(request(8))  # 4 items of each per batch
    r.insert([meta("c0", 99)], 0)
    assert r.grantable(plan, 1000) == 0  # b is under its min_size
    assert r.grantable(r.plan(request(8, by_buffer={"a": 8})), 1000) == 1000
    r.insert([meta("c1", 11)], 0)  # b: 110 inserted, target 10 + 40 items: 12 batches of 4
    assert r.grantable(plan, 1000) == 12
    r.sample(plan, 12, 0, 0)
    assert r.grantable(plan, 1000) == 0
    assert r.stats()["a"]["sampled_items"] == r.stats()["b"]["sampled_items"] == 48


# -- chunks shared by buffers -----------------------------------------------------------------

def test_a_chunk_in_two_buffers_dies_only_when_both_released_it():
    r = replay({"small": buffer_config(capacity=200, rate_limit=FREE),
                "large": buffer_config(kind="prioritized", capacity=400, rate_limit=FREE)},
               mix=[("small", 1.0)])
    deaths = {}
    for i in range(8):
        _, dead = r.insert([meta(f"c{i}", 100)], 0)
        for cid in dead:
            deaths[cid] = i
        # the registry holds exactly what some buffer refers to
        held = r.buffers["small"].chunk_ids() | r.buffers["large"].chunk_ids()
        assert {c for c in (f"c{j}" for j in range(i + 1)) if c in r} == held
    # small lets go of c_i when c_{i+2} comes, large when c_{i+4} does: the later one counts
    assert deaths == {"c0": 4, "c1": 5, "c2": 6, "c3": 7}
    assert r.stats()["small"]["released_chunks"] == 6
    assert r.stats()["large"]["released_chunks"] == 4


def test_a_late_retry_of_a_released_chunk_is_not_indexed_again():
    """Its bytes were deleted with its release: indexing it again would hand learners a
    chunk that storage no longer holds."""
    r = replay({"small": buffer_config(capacity=200, rate_limit=FREE)}, mix=[("small", 1.0)])
    for i in range(3):
        r.insert([meta(f"c{i}", 100)], 0)
    assert "c0" not in r  # evicted by c2
    fresh, dead = r.insert([meta("c0", 100)], 0)
    assert fresh == [] and dead == [] and "c0" not in r
    assert r.buffers["small"].chunk_ids() == {"c1", "c2"}


def test_insert_into_limits_which_buffers_hold_a_chunk():
    r = replay({"a": buffer_config(capacity=100, rate_limit=FREE),
                "b": buffer_config(capacity=1000, rate_limit=FREE)},
               mix=[("a", 1.0)], collector={"insert_into": ["a"]})
    for i in range(3):
        _, dead = r.insert([meta(f"c{i}", 100)], 0)
        assert dead == ([f"c{i - 1}"] if i else [])  # nobody else holds it
    assert len(r.buffers["b"]) == 0 and r.size() == 100


# -- feedback ---------------------------------------------------------------------------------

def test_feedback_is_checked_whole_before_any_of_it_applies():
    r = replay({"p": buffer_config(kind="prioritized", capacity=10, rate_limit=FREE)},
               mix=[("p", 1.0)])
    r.insert([meta("c0", 10)], 0)
    good = PriorityUpdate(buffer="p", item_ids=[3], priorities=[50.0])
    tree = r.buffers["p"].sum.tree.copy()
    for updates, consumed, field in [
        ([good, PriorityUpdate(buffer="p", item_ids=[4], priorities=[-1.0])], [],
         "priorities.1.priorities"),
        ([good, PriorityUpdate(buffer="p", item_ids=[4], priorities=[float("nan")])], [],
         "priorities.1.priorities"),
        ([good, PriorityUpdate(buffer="q", item_ids=[4], priorities=[1.0])], [],
         "priorities.1.buffer"),
        ([good], [Consumed(buffer="q", chunk_ids=["c0"])], "consumed.0.buffer"),
    ]:
        with pytest.raises((BadRequest, UnknownBuffer)) as info:
            r.check_feedback(updates, consumed)
        assert info.value.field == field
        np.testing.assert_array_equal(r.buffers["p"].sum.tree, tree)
    r.check_feedback([good], [])
    assert r.update_priorities([good]) == 1
    assert not np.array_equal(r.buffers["p"].sum.tree, tree)


# -- snapshots --------------------------------------------------------------------------------

def busy_replay() -> Replay:
    r = replay({"uni": buffer_config(capacity=250, rate_limit=FREE),
                "prio": buffer_config(kind="prioritized", capacity=400, rate_limit=FREE),
                "seq": buffer_config(kind="episode", capacity=300, sequence_length=4,
                                     rate_limit=FREE),
                "fifo": buffer_config(kind="queue", capacity=10_000, rate_limit=FREE)},
               mix=[("uni", 0.5), ("prio", 0.5)])
    rng = np.random.default_rng(0)
    for i in range(9):
        n = int(rng.integers(40, 90))
        r.insert([ChunkMeta(chunk_id=f"c{i}", length=n, policy_version=i // 3,
                            segments=[(0, n // 2), (n // 2, n - n // 2)])], i)
        _, parts, _ = r.sample(r.plan(request(16, 2)), 2, i, i // 3)
        r.update_priorities([PriorityUpdate(buffer="prio", item_ids=parts[1].item_ids.ravel()
                                            .tolist(), priorities=rng.random(16).tolist())])
    r.sample(r.plan(request(1, 3, by_buffer={"fifo": 1})), 3, 9, 3)  # c0..c2 in flight
    r.consume([Consumed(buffer="fifo", chunk_ids=["c0"])])
    return r


def test_save_and_load_round_trip_buffers_registry_and_counters(tmp_path):
    a = busy_replay()
    storage = DirectoryStorage(tmp_path / "storage")
    assert busy_replay().load(storage) is None  # nothing saved yet
    counters = {"env_steps": 123, "policy_version": 4}
    Replay.write_snapshot(storage, a.snapshot(), {"env_steps": 1}, generation=1)
    Replay.write_snapshot(storage, a.snapshot(), counters, generation=2)
    # the newer generation replaced the older one's blobs
    blobs = sorted(p.name for p in (tmp_path / "storage" / "blobs").iterdir())
    assert blobs == sorted(["snapshot.coordinator"] + [f"snapshot.buffer.{n}.2"
                                                         for n in a.buffers])

    b = Replay(a.cfg)
    assert b.load(storage) == counters and b.generation == 2
    # every chunk is held by as many buffers as before (in-flight ones queued again)
    assert b.registry.refs == a.registry.refs
    assert len(b.registry) == len(a.registry) > 0
    rates = ("inserts_per_s", "samples_per_s")
    sa, sb = a.stats(), b.stats()
    for name in ("uni", "prio", "seq"):
        assert {k: v for k, v in sb[name].items() if k not in rates} == \
            {k: v for k, v in sa[name].items() if k not in rates}, name
    assert sb["fifo"]["queued_chunks"] == sa["fifo"]["queued_chunks"] + 2
    assert sb["fifo"]["in_flight_chunks"] == 0
    # and both carry on alike: the same draws (generators travel too), the same releases
    plan = a.plan(request(16, 3))
    ids_a, parts_a, _ = a.sample(plan, 3, 20, 5)
    ids_b, parts_b, _ = b.sample(b.plan(request(16, 3)), 3, 20, 5)
    assert ids_a == ids_b
    for pa, pb in zip(parts_a, parts_b, strict=True):
        np.testing.assert_array_equal(pa.item_ids, pb.item_ids)
        np.testing.assert_array_equal(pa.rows, pb.rows)
    more = [meta("c9", 300)]
    assert a.insert(more, 21)[1] == b.insert(more, 21)[1]


# == over HTTP, against real coordinator processes ==============================================

MIX = {"buffers": {"all": buffer_config(rate_limit=FREE),
                   "recent": buffer_config(sample_range=16, rate_limit={"min_size": 100})},
       "learner": {"mix": [{"buffer": "all", "fraction": 0.7},
                           {"buffer": "recent", "fraction": 0.3}]}}
RATE = {"buffers": {"replay": buffer_config(rate_limit={"min_size": 100})}}
TWO = {"buffers": {"uni": buffer_config(capacity=300, rate_limit=FREE),
                   "prio": buffer_config(kind="prioritized", capacity=600, rate_limit=FREE)},
       "learner": {"mix": [{"buffer": "uni", "fraction": 1.0}]}}
PRIO = {"buffers": {"prio": buffer_config(kind="prioritized", capacity=100, alpha=1.0,
                                          beta=0.4, rate_limit=FREE)},
        "learner": {"mix": [{"buffer": "prio", "fraction": 1.0}]}}
QUEUE = {"buffers": {"queue": buffer_config(kind="queue", capacity=1_000_000,
                                            rate_limit=FREE)},
         "learner": {"mix": [{"buffer": "queue", "fraction": 1.0}]},
         "algo": {"name": "ppo"}}
SNAP = {"name": "snap-run",
        "buffers": {"replay": buffer_config(capacity=300, rate_limit=FREE),
                    "prio": buffer_config(kind="prioritized", capacity=500, alpha=1.0,
                                          rate_limit=FREE),
                    "queue": buffer_config(kind="queue", capacity=10_000, rate_limit=FREE)},
        "learner": {"mix": [{"buffer": "replay", "fraction": 0.5},
                            {"buffer": "prio", "fraction": 0.5}]}}

BOOTS = {
    "test_http_mix_composes_batches_and_names_unknown_buffers": MIX,
    "test_http_sampling_before_min_size_is_429_until_an_insert_wakes_it": RATE,
    "test_http_storage_holds_exactly_the_chunks_some_buffer_refers_to": TWO,
    "test_http_priorities_from_learn_info_steer_sampling_and_stale_ids_are_ignored": PRIO,
    "test_http_bad_priorities_are_rejected_naming_the_field_and_change_nothing": PRIO,
    "test_http_concurrent_learners_get_every_queued_chunk_exactly_once": QUEUE,
    "test_http_snapshot_and_resume_across_a_coordinator_restart": SNAP,
}


@pytest.fixture(scope="module", autouse=True)
def _boot_coordinators(request, coordinator_pool):
    """Boot the coordinators the selected tests will take, side by side."""
    prewarm_module(request, coordinator_pool, BOOTS)


def buffer_stats(c: CoordinatorProc, name: str | None = None) -> dict:
    """GET /buffers (or /buffers/<name>) without the rates, which move with the clock."""
    def steady(stats: dict) -> dict:
        return {k: v for k, v in stats.items() if k not in ("inserts_per_s", "samples_per_s")}

    if name is not None:
        return steady(get(c, f"/buffers/{name}"))
    return {n: steady(s) for n, s in get(c, "/buffers")["buffers"].items()}


def sample(c: CoordinatorProc, learner_id: str, batch_size: int, num_batches: int = 1,
           **extra) -> dict:
    return ok(post(c, "/sample", {"worker_id": learner_id, "batch_size": batch_size,
                                  "num_batches": num_batches, **extra}))


def learn_info(c: CoordinatorProc, learner_id: str, **body) -> requests.Response:
    return post(c, "/learn-info", {"worker_id": learner_id, "train_iterations": 0,
                                   "policy_version": -1, **body})


def drawn_ids(c: CoordinatorProc, learner_id: str, buffer: str, n: int = 10) -> np.ndarray:
    """Item ids of n batches of 100 from one buffer."""
    got = sample(c, learner_id, 1, n, by_buffer={buffer: 100})
    return np.asarray(got["parts"][0]["item_ids"])


def test_http_mix_composes_batches_and_names_unknown_buffers(coordinator, task_sink):
    c = coordinator(**MIX)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    wid, tid, lid = col["worker_id"], collect["task_id"], lrn["worker_id"]
    ok(report(c, wid, tid, [(write_chunk(c, 50), 50)]))
    # "recent" holds 50 of its 100 min_size items: the mix must wait for it ...
    r = post(c, "/sample", {"worker_id": lid, "batch_size": 10, "num_batches": 1})
    assert r.status_code == 429
    # ... while "all" alone may be sampled
    alone = sample(c, lid, 1, 2, by_buffer={"all": 5})
    assert [(p["buffer"], p["key"], np.shape(p["rows"])) for p in alone["parts"]] == [
        ("all", "all", (2, 5))]

    chunks = {write_chunk(c, 60): 60, write_chunk(c, 10): 10}
    ok(report(c, wid, tid, list(chunks.items())))  # items 0..119; the newest 16: 104..119
    got = sample(c, lid, 10, 20)  # the configured mix: 7 + 3
    assert got["num_batches"] == 20
    every, recent = got["parts"]
    assert (every["buffer"], recent["buffer"]) == ("all", "recent")
    assert np.shape(every["item_ids"]) == (20, 7) and np.shape(recent["item_ids"]) == (20, 3)
    assert set(np.ravel(recent["item_ids"]).tolist()) <= set(range(104, 120))
    assert min(np.ravel(every["item_ids"])) < 104
    for part in got["parts"]:
        assert max(np.ravel(part["chunk_index"])) < len(got["chunk_ids"])
    assert len(set(got["chunk_ids"])) == len(got["chunk_ids"])
    # a mix in the request: 0.2 x 7 = 1.4 and 0.8 x 7 = 5.6 items: the larger remainder wins
    got = sample(c, lid, 7, 3, mix=[{"buffer": "recent", "fraction": 0.2},
                                    {"buffer": "all", "fraction": 0.8}])
    assert [(p["buffer"], np.shape(p["rows"])) for p in got["parts"]] == [
        ("recent", (3, 1)), ("all", (3, 6))]
    got = sample(c, lid, 1, 2, by_buffer={"recent": 2, "all": 4})
    assert [(p["key"], np.shape(p["rows"])) for p in got["parts"]] == [
        ("recent", (2, 2)), ("all", (2, 4))]
    stats = buffer_stats(c)
    assert stats["all"]["sampled_items"] == 10 + 140 + 18 + 8
    assert stats["recent"]["sampled_items"] == 60 + 3 + 4

    before = buffer_stats(c)
    for body, field in [
        ({"mix": [{"buffer": "nope", "fraction": 1.0}]}, "mix.0.buffer"),
        ({"mix": [{"buffer": "all", "fraction": 0.5}, {"buffer": "nope", "fraction": 0.5}]},
         "mix.1.buffer"),
        ({"by_buffer": {"all": 4, "nope": 4}}, "by_buffer.nope"),
    ]:
        r = post(c, "/sample", {"worker_id": lid, "batch_size": 8, "num_batches": 1, **body})
        assert r.status_code == 404 and r.json()["field"] == field, r.text
        assert "'nope'" in r.json()["error"]
    r = HTTP.get(c.api("/buffers/nope"), timeout=TIMEOUT)
    assert r.status_code == 404 and "'nope'" in r.json()["error"]
    assert buffer_stats(c) == before
    assert buffer_stats(c, "recent") == {"name": "recent", **before["recent"]}


def test_http_sampling_before_min_size_is_429_until_an_insert_wakes_it(coordinator, task_sink):
    c = coordinator(**RATE)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    wid, tid, lid = col["worker_id"], collect["task_id"], lrn["worker_id"]
    ok(report(c, wid, tid, [(write_chunk(c, 60), 60)]))
    body = {"worker_id": lid, "batch_size": 16, "num_batches": 4}

    r = post(c, "/sample", body)
    assert r.status_code == 429, r.text
    assert float(r.headers["Retry-After"]) > 0
    answer = r.json()
    assert answer["retry_after_s"] == float(r.headers["Retry-After"])
    assert "rate limited" in answer["error"] and answer["field"] is None
    # a bounded wait: the answer comes when wait_s is up, still 429
    t0 = time.monotonic()
    r = post(c, "/sample", {**body, "wait_s": 0.3})
    assert r.status_code == 429 and time.monotonic() - t0 >= 0.3
    assert buffer_stats(c, "replay")["sampled_items"] == 0
    assert c.status()["counters"]["granted_batches"] == 0

    # a learner waiting in /sample is answered as soon as an insert reaches min_size
    answers: list[requests.Response] = []
    sending = threading.Event()

    def waiting_learner() -> None:
        sending.set()
        answers.append(requests.post(c.api("/sample"), json={**body, "wait_s": 20},
                                     headers={"Connection": "close"}, timeout=30))

    thread = threading.Thread(target=waiting_learner, daemon=True)
    thread.start()
    assert sending.wait(5)
    ok(report(c, wid, tid, [(write_chunk(c, 40), 40)]))  # 100 items
    thread.join(timeout=15)
    assert not thread.is_alive(), "the waiting sample request was never answered"
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["num_batches"] == 4
    assert buffer_stats(c, "replay")["sampled_items"] == 64


def test_http_storage_holds_exactly_the_chunks_some_buffer_refers_to(coordinator, task_sink):
    """Every chunk goes into both buffers (insert_into defaults to all): a ring of 300 and a
    prioritized ring of 600 items. A chunk leaves storage when the second of them lets go of
    it, never earlier, and never stays longer."""
    c = coordinator(**TWO)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    store = DirectoryStorage(c.storage_dir)
    ids: list[str] = []
    for i in range(9):
        ids.append(write_chunk(c, 100))
        ok(report(c, col["worker_id"], collect["task_id"], [(ids[-1], 100)]))
        total = 100 * (i + 1)
        held = {name: {ids[j] for j in range(i + 1) if 100 * (j + 1) > total - cap}
                for name, cap in (("uni", 300), ("prio", 600))}
        referred = held["uni"] | held["prio"]
        # nothing was deleted too early: at once, every referred-to chunk is still there
        assert referred <= set(store.list_chunks()), i
        # and whatever no buffer refers to any more goes (the janitor works in the back)
        wait_for(lambda r=referred: set(store.list_chunks()) == r,
                 what=f"storage to hold exactly {len(referred)} chunks after chunk {i}")
        if i == 3:  # uni let go of chunk 0, prio still has it: it must stay
            assert ids[0] not in held["uni"] and ids[0] in store.list_chunks()
        # what either buffer hands out can be read
        got = sample(c, lrn["worker_id"], 1, 2, by_buffer={"uni": 16, "prio": 16})
        assert set(got["chunk_ids"]) <= referred
        assert len(store.get_chunks(got["chunk_ids"])) == len(got["chunk_ids"])
        stats = buffer_stats(c)
        assert stats["uni"]["released_chunks"] == i + 1 - len(held["uni"])
        assert stats["prio"]["released_chunks"] == i + 1 - len(held["prio"])
        assert c.status()["buffer"]["chunks"] == len(referred)
    assert ids[0] not in store.list_chunks() and ids[3] in store.list_chunks()
    # the monitors also appear under their metric names, for the logger
    metrics = c.status()["metrics"]
    for name in ("uni", "prio"):
        stats = buffer_stats(c)[name]
        for key in ("inserts_per_s", "samples_per_s", "use_count_mean", "use_count_max",
                    "staleness_mean", "policy_lag_mean"):
            assert f"buffer/{name}/{key}" in metrics, key
        for key in ("size", "evicted_items", "dropped_items", "released_chunks"):
            assert metrics[f"buffer/{name}/{key}"] == stats[key], key


def test_http_priorities_from_learn_info_steer_sampling_and_stale_ids_are_ignored(
        coordinator, task_sink):
    c = coordinator(**PRIO)  # a prioritized ring of 100 items, alpha 1, beta 0.4
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    wid, tid, lid = col["worker_id"], collect["task_id"], lrn["worker_id"]
    ok(report(c, wid, tid, [(write_chunk(c, 100), 100)]))  # item ids 0..99
    first = sample(c, lid, 100)["parts"][0]
    assert np.allclose(first["weights"], 1.0)  # equal priorities: equal weights
    assert set(np.ravel(first["item_ids"]).tolist()) <= set(range(100))

    priorities = np.full(100, 0.01)
    priorities[7] = 1000.0
    ok(learn_info(c, lid, priorities=[{"buffer": "prio", "item_ids": list(range(100)),
                                       "priorities": priorities.tolist()}]))
    stats = buffer_stats(c, "prio")
    assert stats["priority_updates"] == 100 and stats["stale_priority_updates"] == 0
    got = sample(c, lid, 1, 10, by_buffer={"prio": 100})["parts"][0]
    ids, weights = np.asarray(got["item_ids"]), np.asarray(got["weights"])
    assert (ids == 7).mean() > 0.95  # P(7) = 1000 / (1000 + 99 x 0.01)
    # importance weights: (P_i / P_min)^-beta, the largest (the rarest items) 1
    assert weights[ids == 7] == pytest.approx(((1000 + 1e-6) / (0.01 + 1e-6)) ** -0.4,
                                              rel=1e-4)
    assert np.allclose(weights[ids != 7], 1.0)

    # a new chunk overwrites every slot: id 7's slot now holds id 107
    ok(report(c, wid, tid, [(write_chunk(c, 100), 100)]))
    ok(learn_info(c, lid, priorities=[{"buffer": "prio", "item_ids": [7, 150],
                                       "priorities": [1e6, 0.0]}]))
    stats = buffer_stats(c, "prio")
    assert stats["stale_priority_updates"] == 1 and stats["priority_updates"] == 101
    ids = drawn_ids(c, lid, "prio")
    assert ids.min() >= 100
    assert (ids == 107).mean() < 0.05  # the stale update did not reach the slot's new item
    assert 150 not in ids              # the live one did: its priority is ~0 now


def test_http_bad_priorities_are_rejected_naming_the_field_and_change_nothing(
        coordinator, task_sink):
    c = coordinator(**PRIO)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    lid = lrn["worker_id"]
    cid = write_chunk(c, 100)
    ok(report(c, col["worker_id"], collect["task_id"], [(cid, 100)]))
    good = {"buffer": "prio", "item_ids": [5], "priorities": [1000.0]}
    meta = {"train_iterations": 77, "policy_version": 5, "metrics": {"train/loss": 1.0}}
    before_status, before_stats = c.status(), buffer_stats(c)

    def raw(priorities: str) -> bytes:  # JSON's NaN and Infinity, as Python's json writes them
        return json.dumps({"worker_id": lid, **meta}).encode()[:-1] + (
            ', "priorities": [{"buffer": "prio", "item_ids": [5, 6], '
            f'"priorities": [1000.0, {priorities}]}}]}}').encode()

    cases = [
        ({"priorities": [good, {"buffer": "prio", "item_ids": [6], "priorities": [-0.5]}]},
         400, "priorities.1.priorities"),
        ({"priorities": [good, {"buffer": "nope", "item_ids": [6], "priorities": [1.0]}]},
         404, "priorities.1.buffer"),
        ({"priorities": [good], "consumed": [{"buffer": "nope", "chunk_ids": [cid]}]},
         404, "consumed.0.buffer"),
        ({"priorities": [good, {"buffer": "prio", "item_ids": [6, 7], "priorities": [1.0]}]},
         400, "priorities.1"),
        (raw("NaN"), 400, "priorities.0.priorities"),
        (raw("Infinity"), 400, "priorities.0.priorities"),
        (raw("-Infinity"), 400, "priorities.0.priorities"),
    ]
    for body, status, field in cases:
        if isinstance(body, bytes):
            r = HTTP.post(c.api("/learn-info"), data=body, timeout=TIMEOUT,
                          headers={"Content-Type": "application/json"})
        else:
            r = learn_info(c, lid, **meta, **body)
        assert r.status_code == status and r.json()["field"] == field, (body, r.text)
        if status == 404:
            assert "'nope'" in r.json()["error"]
        else:
            assert field in r.json()["error"]
        after = c.status()
        assert after["counters"] == before_status["counters"], body
        assert after["train"] == before_status["train"] == {}
        assert buffer_stats(c) == before_stats, body
    assert (drawn_ids(c, lid, "prio") == 5).mean() < 0.05  # item 5 kept its priority

    # the good half alone is applied: it would have shown
    ok(learn_info(c, lid, **meta, priorities=[good]))
    assert buffer_stats(c, "prio")["priority_updates"] == 1
    assert c.status()["counters"]["train_iterations"] == 77
    assert (drawn_ids(c, lid, "prio") == 5).mean() > 0.9


def test_http_concurrent_learners_get_every_queued_chunk_exactly_once(coordinator, task_sink):
    """Three learner threads poll /sample on a queue buffer while a collector thread writes
    and reports chunks; each learner reports what it used as consumed."""
    c = coordinator(**QUEUE)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    learners = [lrn["worker_id"]] + [register(c, "learner", task_sink())["worker_id"]
                                     for _ in range(2)]
    n_chunks = 60
    lengths = {}
    handed: list[tuple[str, str, int]] = []  # (learner, chunk id, length)
    lock = threading.Lock()
    all_in = threading.Event()
    errors: list[str] = []
    deadline = time.monotonic() + 30

    def collector() -> None:
        try:
            i = 0
            while i < n_chunks:
                group = []
                for _ in range(1 + i % 3):
                    if i < n_chunks:
                        cid = write_chunk(c, 5 + i % 7)
                        lengths[cid] = 5 + i % 7
                        group.append((cid, lengths[cid]))
                        i += 1
                r = requests.post(c.api("/chunks"), json={
                    "worker_id": col["worker_id"], "task_id": collect["task_id"],
                    "chunks": [{"chunk_id": cid, "length": n, "policy_version": -1}
                               for cid, n in group]},
                    headers={"Connection": "close"}, timeout=TIMEOUT)
                assert r.status_code == 200, r.text
        except BaseException as err:  # surfaced below
            errors.append(f"collector: {err!r}")

    def learner(worker_id: str) -> None:
        try:
            while not all_in.is_set() and time.monotonic() < deadline:
                r = requests.post(c.api("/sample"), json={
                    "worker_id": worker_id, "batch_size": 1, "num_batches": 3, "wait_s": 0.2},
                    headers={"Connection": "close"}, timeout=TIMEOUT)
                if r.status_code == 429:
                    continue
                assert r.status_code == 200, r.text
                got = r.json()
                [part] = got["parts"]
                ids = [got["chunk_ids"][k] for [k] in part["chunk_index"]]
                assert len(ids) == got["num_batches"] == len(part["lengths"]) >= 1
                r = requests.post(c.api("/learn-info"), json={
                    "worker_id": worker_id, "train_iterations": 0, "policy_version": -1,
                    "consumed": [{"buffer": "queue", "chunk_ids": ids}]},
                    headers={"Connection": "close"}, timeout=TIMEOUT)
                assert r.status_code == 200, r.text
                with lock:
                    handed.extend((worker_id, cid, n) for cid, n in
                                  zip(ids, part["lengths"], strict=True))
                    if len(handed) >= n_chunks:
                        all_in.set()
        except BaseException as err:  # surfaced below
            errors.append(f"learner {worker_id}: {err!r}")
            all_in.set()

    threads = [threading.Thread(target=collector, daemon=True)] + [
        threading.Thread(target=learner, args=(w,), daemon=True) for w in learners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.1, deadline + 5 - time.monotonic()))
    assert not [t for t in threads if t.is_alive()], "a thread is stuck"
    assert errors == []
    counts = Counter(cid for _, cid, _ in handed)
    assert sorted(counts) == sorted(lengths), "some chunk was never handed out"
    assert set(counts.values()) == {1}, [cid for cid, n in counts.items() if n > 1]
    assert all(lengths[cid] == n for _, cid, n in handed)
    stats = buffer_stats(c, "queue")
    assert stats["inserted_chunks"] == stats["consumed_chunks"] == n_chunks
    assert stats["released_chunks"] == n_chunks
    assert stats["sampled_items"] == stats["consumed_items"] == sum(lengths.values())
    assert stats["queued_chunks"] == stats["in_flight_chunks"] == stats["size"] == 0
    assert stats["dropped_items"] == 0
    store = DirectoryStorage(c.storage_dir)
    wait_for(lambda: store.list_chunks() == [], what="consumed chunks deleted from storage")


def test_http_snapshot_and_resume_across_a_coordinator_restart(coordinator, coordinator_pool,
                                                              task_sink):
    """Coordinator A takes chunks, samples, priorities and a consumed chunk, then is stopped
    with SIGTERM (closing saves a snapshot). Coordinator B starts on the same storage and run
    name with `--resume`: its counters and buffers are A's last ones, and it goes on from
    there (priorities, the queue, which chunks storage needs)."""
    a = coordinator(**SNAP)  # replay: ring of 300; prio: ring of 500; queue
    col, collect, lrn, _ = collector_and_learner(a, task_sink)
    wid, tid, lid = col["worker_id"], collect["task_id"], lrn["worker_id"]
    ids = [write_chunk(a, 100) for _ in range(6)]  # chunk i: items 100 i .. 100 i + 99
    for i, cid in enumerate(ids):
        ok(report(a, wid, tid, [(cid, 100)], policy_version=i // 2,
                  episode_returns=[float(i)], episode_lengths=[100]))
    sample(a, lid, 8, 3)
    queued = sample(a, lid, 1, 2, by_buffer={"queue": 1})
    assert queued["chunk_ids"] == ids[:2]
    favourite = 450  # chunk 4, row 50: held by prio (items 100..599)
    priorities = np.full(500, 0.01)
    priorities[favourite - 100] = 1000.0
    ok(learn_info(a, lid, train_iterations=42, policy_version=3, metrics={"train/loss": 0.5},
                  priorities=[{"buffer": "prio", "item_ids": list(range(100, 600)),
                               "priorities": priorities.tolist()}],
                  consumed=[{"buffer": "queue", "chunk_ids": [ids[0]]}]))
    store = DirectoryStorage(a.storage_dir)
    # chunk 0: out of replay and prio, consumed from the queue; chunk 1 in flight
    wait_for(lambda: store.list_chunks() == sorted(ids[1:]), what="chunk 0 deleted")
    status_a, buffers_a = a.status(), buffer_stats(a)
    assert status_a["counters"] == {
        "env_steps": 600, "train_iterations": 42, "granted_batches": 5, "policy_version": 3,
        "chunks_accepted": 6, "episodes": 6}
    assert buffers_a["queue"]["in_flight_chunks"] == 1

    assert coordinator_pool.stop(a) == 0, a.log()
    assert (a.storage_dir / "blobs" / "snapshot.coordinator").is_file()
    b = coordinator_pool.start(a.config, a.storage_dir, "--resume", "--name", "snap-run")
    status_b, buffers_b = b.status(), buffer_stats(b)
    assert status_b["run"]["name"] == "snap-run" and status_b["run"]["state"] == "running"
    assert status_b["counters"] == status_a["counters"]
    # (the total size counts queued items: A's in-flight chunk is queued again in B)
    assert status_a["buffer"] == {"size": 300 + 500 + 400, "chunks": 5}
    assert status_b["buffer"] == {"size": 300 + 500 + 500, "chunks": 5}
    assert buffers_b["replay"] == buffers_a["replay"]
    assert buffers_b["prio"] == buffers_a["prio"]
    # the chunk A had handed out but not seen consumed is queued again, at the head (and
    # not counted as sampled: it will be handed out again)
    in_flight = {"in_flight_chunks": 0, "in_flight_items": 0,
                 "queued_chunks": buffers_a["queue"]["queued_chunks"] + 1,
                 "size": buffers_a["queue"]["size"] + 100,
                 "sampled_items": buffers_a["queue"]["sampled_items"] - 100}
    assert buffers_b["queue"] == buffers_a["queue"] | in_flight
    assert "restored run at 600 env steps" in b.log()

    # B goes on from there: workers register again ...
    col, collect, lrn, _ = collector_and_learner(b, task_sink)
    wid, tid, lid = col["worker_id"], collect["task_id"], lrn["worker_id"]
    # ... prio still favours the item A's learner favoured
    assert (drawn_ids(b, lid, "prio") == favourite).mean() > 0.95
    # ... counters continue
    ids.append(write_chunk(b, 100))
    r = ok(report(b, wid, tid, [(ids[-1], 100)]))
    assert r["env_steps"] == 700 and b.status()["counters"]["chunks_accepted"] == 7
    # ... and the chunk registry was rebuilt: chunk 1 left prio just now, only the queue
    # holds it; consumed, it goes, while chunk 2 stays for prio
    assert ids[1] in store.list_chunks()
    queued = sample(b, lid, 1, 2, by_buffer={"queue": 1})
    assert queued["chunk_ids"] == ids[1:3]
    ok(learn_info(b, lid, train_iterations=43, policy_version=3,
                  consumed=[{"buffer": "queue", "chunk_ids": ids[1:3]}]))
    wait_for(lambda: store.list_chunks() == sorted(ids[2:]), what="chunk 1 deleted")
