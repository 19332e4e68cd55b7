"""Clearing a buffer and loading chunks into one, over HTTP, against the real coordinator in
its own process (`POST /buffers/<name>/clear`, `POST /buffers/<name>/load`)."""

from __future__ import annotations

import pytest

from rlfleet.shared.infra.storage import DirectoryStorage

from .helpers import (
    HTTP,
    TIMEOUT,
    buffer_config,
    collector_and_learner,
    ok,
    post,
    prewarm_module,
    report,
    wait_for,
    write_chunk,
)

DEFAULT: dict = {}
RARE_SNAPSHOTS = {"coordinator": {"snapshot_interval_s": 3600}}
PRIORITIZED = {"buffers": {"replay": buffer_config(kind="prioritized")}}
QUEUE_WITH_LAG = {"buffers": {"rollouts": buffer_config(kind="queue")},
                  "learner": {"mix": [{"buffer": "rollouts", "fraction": 1.0}]},
                  "algo": {"name": "ppo", "max_policy_lag": 2}}

BOOTS = {
    "test_clear_empties_the_buffer_and_releases_its_chunks": DEFAULT,
    "test_a_clear_survives_a_coordinator_crash": RARE_SNAPSHOTS,
    "test_clear_refuses_unknown_buffers_and_bodies_with_fields": DEFAULT,
    "test_load_indexes_stored_chunks_in_the_buffer": DEFAULT,
    "test_load_gives_a_prioritized_buffer_its_priorities": PRIORITIZED,
    "test_a_queue_that_drops_stale_rows_refuses_a_load": QUEUE_WITH_LAG,
}


@pytest.fixture(scope="module", autouse=True)
def _boot_coordinators(request, coordinator_pool):
    prewarm_module(request, coordinator_pool, BOOTS)


def _fill(c, task_sink, chunks: int) -> list[str]:
    col, collect, _, _ = collector_and_learner(c, task_sink)
    ids = [write_chunk(c, 128) for _ in range(chunks)]
    ok(report(c, col["worker_id"], collect["task_id"], [(cid, 128) for cid in ids]))
    return ids


def test_clear_empties_the_buffer_and_releases_its_chunks(coordinator, task_sink):
    c = coordinator()
    ids = _fill(c, task_sink, 3)
    assert c.status()["buffer"] == {"size": 384, "chunks": 3}
    assert ok(post(c, "/buffers/replay/clear")) == {"name": "replay", "items": 384,
                                                     "chunks": 3}
    s = c.status()
    assert s["buffer"] == {"size": 0, "chunks": 0}
    assert s["buffers"]["replay"]["size"] == 0
    assert s["buffers"]["replay"]["dropped/cleared"] == 384  # the rate limiter's line drops
    assert s["counters"]["env_steps"] == 384  # what was collected stays collected
    assert s["ledger"]["dropped"] == {"cleared": 3} and s["ledger"]["balanced"]
    store = DirectoryStorage(c.storage_dir)
    wait_for(lambda: not set(ids) & set(store.list_chunks()), what="cleared chunks deleted")
    # an empty buffer clears to nothing, and fills again from collectors
    assert ok(post(c, "/buffers/replay/clear", {})) == {"name": "replay", "items": 0,
                                                         "chunks": 0}
    _fill(c, task_sink, 1)
    assert c.status()["buffer"] == {"size": 128, "chunks": 1}


def test_a_clear_survives_a_coordinator_crash(coordinator, coordinator_pool, task_sink):
    """No snapshot between the clear and a SIGKILL: the restarted coordinator replays the
    journal, where the clear sits between the reports before and after it."""
    c = coordinator(**RARE_SNAPSHOTS)
    col, collect, _, _ = collector_and_learner(c, task_sink)
    before = [write_chunk(c, 128) for _ in range(2)]
    ok(report(c, col["worker_id"], collect["task_id"], [(cid, 128) for cid in before]))
    assert ok(post(c, "/buffers/replay/clear"))["chunks"] == 2
    after = write_chunk(c, 64)
    ok(report(c, col["worker_id"], collect["task_id"], [(after, 64)]))
    c.proc.kill()
    c.proc.wait(timeout=10)
    resumed = coordinator_pool.start(c.config, c.storage_dir, "--resume",
                                     "--name", c.config["name"])
    try:
        s = resumed.status()
        assert s["buffer"] == {"size": 64, "chunks": 1}
        assert ok(HTTP.get(resumed.api("/buffers/replay/chunks"), timeout=TIMEOUT)
                  )["chunk_ids"] == [after]
        assert s["ledger"]["balanced"] and s["ledger"]["dropped"] == {"cleared": 2}
    finally:
        coordinator_pool.release(resumed)


def test_clear_refuses_unknown_buffers_and_bodies_with_fields(coordinator, task_sink):
    c = coordinator()
    _fill(c, task_sink, 1)
    r = post(c, "/buffers/nope/clear")
    assert r.status_code == 404 and "nope" in r.json()["error"], r.text
    r = post(c, "/buffers/replay/clear", {"everything": True})
    assert r.status_code == 400 and r.json()["field"] == "everything", r.text
    r = HTTP.post(c.api("/buffers/replay/clear"), data="[", timeout=TIMEOUT,
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert c.status()["buffer"]["size"] == 128  # nothing was cleared


def test_clear_needs_the_token(coordinator_pool):
    c = coordinator_pool.take(environ={"RLFLEET_TOKEN": "s3cret-token-for-clear"})
    c.token = "s3cret-token-for-clear"
    try:
        r = post(c, "/buffers/replay/clear")
        assert r.status_code == 401, r.text
        r = post(c, "/buffers/replay/clear",
                 headers={"Authorization": "Bearer s3cret-token-for-clear"})
        assert r.status_code == 200, r.text
    finally:
        coordinator_pool.release(c)


def test_load_indexes_stored_chunks_in_the_buffer(coordinator, task_sink):
    c = coordinator()
    _fill(c, task_sink, 1)
    ids = [write_chunk(c, 100) for _ in range(2)]
    body = {"chunks": [{"chunk_id": cid, "length": 100, "policy_version": -1}
                       for cid in ids]}
    assert ok(post(c, "/buffers/replay/load", body)) == {"name": "replay", "accepted": 2,
                                                          "items": 328}
    assert ok(post(c, "/buffers/replay/load", body))["accepted"] == 0  # a retry counts once
    s = c.status()
    assert s["counters"]["env_steps"] == 128  # loaded rows are no env steps of this run
    assert s["ledger"]["balanced"] and s["ledger"]["in_buffers"] == 3
    r = post(c, "/buffers/nope/load", body)
    assert r.status_code == 404 and "nope" in r.json()["error"], r.text


def test_load_gives_a_prioritized_buffer_its_priorities(coordinator, task_sink):
    c = coordinator(**PRIORITIZED)
    _fill(c, task_sink, 1)
    cid = write_chunk(c, 4)
    chunk = {"chunk_id": cid, "length": 4, "policy_version": -1}
    r = post(c, "/buffers/replay/load", {"chunks": [chunk], "priorities": [[1.0, 2.0]]})
    assert r.status_code == 400 and r.json()["field"] == "priorities.0", r.text
    ok(post(c, "/buffers/replay/load", {"chunks": [chunk],
                                        "priorities": [[1.0, 2.0, 3.0, 4.0]]}))
    s = c.status()["buffers"]["replay"]
    assert s["size"] == 132 and s["priority_updates"] == 4


# -- `rlfleet buffer save` and `rlfleet buffer load`, against real coordinators ---------------

def _run_dir(tmp_path, c, name: str, **env_changes) -> str:
    """A run directory for coordinator `c`: its config, naming its storage."""
    import yaml

    cfg = {**c.config, "storage": str(c.storage_dir), "env": {**c.config["env"], **env_changes}}
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    return str(run_dir)


def test_save_a_live_buffer_and_load_it_into_another_run(
        coordinator, coordinator_pool, task_sink, tmp_path, capsys):
    from rlfleet.cli import main
    from rlfleet.shared.contract.codec import decode_arrays

    src, dst = coordinator(), coordinator()
    _fill(src, task_sink, 3)
    out = tmp_path / "replay.safetensors"
    assert main(["buffer", "save", _run_dir(tmp_path, src, "src"), "--buffer", "replay",
                 "--out", str(out), "--coordinator", src.url]) == 0
    arrays, meta = decode_arrays(out.read_bytes())
    assert meta["rows"] == "384" and meta["buffer_kind"] == "uniform"
    assert meta["env_id"] == "CartPole-v1" and '"discrete": 2' in meta["action_space"]
    assert arrays["obs"].shape == (384, 4) and arrays["_chunk_lengths"].tolist() == [128] * 3

    _fill(dst, task_sink, 1)
    dst_dir = _run_dir(tmp_path, dst, "dst")
    assert main(["buffer", "load", dst_dir, "--buffer", "replay", "--in", str(out),
                 "--coordinator", dst.url]) == 0
    s = dst.status()
    assert s["buffer"] == {"size": 512, "chunks": 4} and s["ledger"]["balanced"]
    assert s["counters"]["env_steps"] == 128

    # another env's run refuses the file, naming what differs; nothing is loaded
    other = _run_dir(tmp_path, dst, "other", id="Acrobot-v1")
    capsys.readouterr()
    assert main(["buffer", "load", other, "--buffer", "replay", "--in", str(out),
                 "--coordinator", dst.url]) == 2
    err = capsys.readouterr().err
    assert "env_id CartPole-v1 does not match the run's Acrobot-v1" in err, err
    assert main(["buffer", "load", dst_dir, "--buffer", "nope", "--in", str(out),
                 "--coordinator", dst.url]) == 2
    assert "nope" in capsys.readouterr().err
    assert dst.status()["buffer"]["size"] == 512

    # a stopped run's buffer is saved from its final snapshot, the same rows
    assert coordinator_pool.stop(src) == 0, src.log()
    again = tmp_path / "again.safetensors"
    assert main(["buffer", "save", str(tmp_path / "src"), "--buffer", "replay",
                 "--out", str(again)]) == 0
    assert decode_arrays(again.read_bytes())[1]["rows"] == "384"


# -- `Replay.clear` itself, for every kind of buffer ------------------------------------------

KINDS = {
    "uniform": {},
    "prioritized": {"kind": "prioritized"},
    "episode": {"kind": "episode", "sequence_length": 4},
    "sequence": {"kind": "sequence", "sequence_length": 4},
    "queue": {"kind": "queue"},
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_replay_clear_empties_every_kind_and_keeps_the_ledger(kind):
    from rlfleet.shared.contract.wire.experience import ChunkMeta
    from rlfleet.shared.contract.wire.sampling import Consumed, SampleRequest
    from rlfleet.shared.replay.replay import ReadOnlyBuffer, Replay, UnknownBuffer
    from rlfleet.shared.run.config import parse_config

    from .helpers import make_config

    on_policy = {"algo": {"name": "ppo", "batch_size": 32, "rollout_size": 32}} \
        if kind == "queue" else {}
    cfg = make_config(buffers={"b": buffer_config(capacity=10_000, rate_limit={"min_size": 1},
                                                  **KINDS[kind])},
                      learner={"mix": [{"buffer": "b", "fraction": 1.0}]}, **on_policy)
    r = Replay(parse_config(cfg))
    metas = [ChunkMeta(chunk_id=f"c{i}", length=32, policy_version=0, segments=[(0, 32)])
             for i in range(3)]
    r.insert(metas, 0)
    if kind == "queue":  # one chunk in a learner's hands as the buffer is cleared
        plan = r.plan(SampleRequest(worker_id="l", batch_size=32, num_batches=1))
        r.sample(plan, 1, 0, 0, "l")
    items, chunks, dead = r.clear("b")
    # a queue's items are those queued: the chunk in flight is released all the same
    assert (items, chunks) == (64 if kind == "queue" else 96, 3)
    assert sorted(dead) == ["c0", "c1", "c2"]
    assert len(r.buffers["b"]) == 0 and r.buffers["b"].kind == kind
    ledger = r.ledger(acknowledged=3)
    assert ledger["balanced"] and ledger["dropped"] == {"cleared": 3}
    if kind == "queue":
        assert r.consume([Consumed(buffer="b", chunk_ids=["c0"])]) == []  # already gone
    # the emptied buffer fills and snapshots as a fresh one would
    r.insert([ChunkMeta(chunk_id="d0", length=32, policy_version=0, segments=[(0, 32)])], 0)
    assert len(r.buffers["b"]) > 0 and r.buffers["b"].chunk_ids() == {"d0"}
    arrays, meta = r.buffers["b"].snapshot()
    again = Replay(parse_config(cfg))
    again.buffers["b"].restore(arrays, meta)
    assert again.buffers["b"].chunk_ids() == {"d0"}
    with pytest.raises(UnknownBuffer):
        r.clear("nope")
    assert issubclass(ReadOnlyBuffer, ValueError)


def test_a_prioritized_buffer_saves_and_loads_its_priorities(coordinator, task_sink, tmp_path):
    from rlfleet.cli import main
    from rlfleet.shared.contract.codec import decode_arrays

    src, dst = coordinator(**PRIORITIZED), coordinator(**PRIORITIZED)
    _fill(src, task_sink, 2)
    wait_for(lambda: src.status()["run"]["storage"] and
             DirectoryStorage(src.storage_dir).get_blob("snapshot.coordinator") is not None,
             what="a snapshot")
    out = tmp_path / "prioritized.safetensors"
    assert main(["buffer", "save", _run_dir(tmp_path, src, "src"), "--buffer", "replay",
                 "--out", str(out), "--coordinator", src.url]) == 0
    arrays, meta = decode_arrays(out.read_bytes())
    assert meta["buffer_kind"] == "prioritized" and arrays["_priority"].shape == (256,)
    assert (arrays["_priority"] > 0).all()
    assert main(["buffer", "load", _run_dir(tmp_path, dst, "dst"), "--buffer", "replay",
                 "--in", str(out), "--coordinator", dst.url]) == 0
    s = dst.status()["buffers"]["replay"]
    assert s["size"] == 256 and s["priority_updates"] == 256


def test_a_queue_that_drops_stale_rows_refuses_a_load(coordinator):
    """Loaded rows were acted by another run's policies (version -1): where stale rows are
    dropped (`algo.max_policy_lag` here, or the buffer's own), every one of them would be, so
    the load is refused instead, naming the setting."""
    c = coordinator(**QUEUE_WITH_LAG)
    body = {"chunks": [{"chunk_id": write_chunk(c, 64), "length": 64, "policy_version": -1}]}
    r = post(c, "/buffers/rollouts/load", body)
    assert r.status_code == 409, r.text
    assert r.json()["field"] == "name" and "algo.max_policy_lag=2" in r.json()["error"]
    assert c.status()["buffer"]["size"] == 0  # nothing was loaded
