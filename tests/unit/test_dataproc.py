"""The learner's data process against a real coordinator and real storage: the batches it
hands over in shared memory are the rows the coordinator sampled, named by their item ids,
prioritized answers carry weights too, a slow learner holds it back, and it leaves nothing
behind."""

from __future__ import annotations

import os
import signal
import uuid

import numpy as np
import pytest

from rlfleet.learner.feed.dataproc import SHM_DIR, DataProcess, DataProcessError
from rlfleet.learner.feed.staging import expand_stacks
from rlfleet.shared.contract.codec import encode_arrays
from rlfleet.shared.contract.frames import OBS_STACK, pack
from rlfleet.shared.infra.storage.directory import DirectoryStorage

from .helpers import buffer_config, collector_and_learner, ok, post, report, wait_for

PRIORITIZED = {"buffers": {"replay": buffer_config(kind="prioritized", alpha=0.6, beta=0.4)}}


def _write_chunks(c, count: int, n: int = 128, masks: bool = False) -> dict[str, int]:
    """Chunks whose rows tell who they are: obs[:, 0] is a row's unique id, next_obs[:, 0]
    the id + 0.5, reward the id, action the id mod 2, terminated every 7th row."""
    store = DirectoryStorage(c.storage_dir)
    chunks = {}
    for k in range(count):
        ids = np.arange(k * n, (k + 1) * n, dtype=np.float32)
        obs = np.zeros((n, 4), np.float32)
        obs[:, 0] = ids
        next_obs = obs.copy()
        next_obs[:, 0] += 0.5
        arrays = {"obs": obs, "next_obs": next_obs, "reward": ids.copy(),
                  "action": (ids % 2).astype(np.int64), "terminated": ids % 7 == 0,
                  "truncated": np.zeros(n, bool)}
        if masks:  # a game's legal moves: action i is legal where bit i of the id is set
            bits = ids.astype(np.int64)[:, None] >> np.arange(9) & 1
            arrays["action_mask"] = bits.astype(bool)
            arrays["next_action_mask"] = ~bits.astype(bool)
        chunk_id = uuid.uuid4().hex
        store.put_chunk(chunk_id, encode_arrays(arrays, {"policy_version": "-1"}))
        chunks[chunk_id] = n
    return chunks


def _fed(c, make_sink, count: int = 4, masks: bool = False) -> dict:
    col, collect, lrn, _ = collector_and_learner(c, make_sink)
    ok(report(c, col["worker_id"], collect["task_id"],
              list(_write_chunks(c, count, masks=masks).items())))
    return lrn


def _data_process(c, lrn: dict, **kw) -> DataProcess:
    settings = dict(batch_size=16, batches_per_request=4, depth=1, cache_size=64)
    settings.update(kw)
    return DataProcess(c.url, str(c.storage_dir), "run", lrn["worker_id"], **settings).start()


def _own_files(dp: DataProcess) -> list:
    assert dp._proc is not None
    return list(SHM_DIR.glob(f"rlfleet-dp-{dp._proc.pid}-*"))


def test_batches_are_the_rows_the_coordinator_sampled(coordinator, task_sink):
    c = coordinator()
    dp = _data_process(c, _fed(c, task_sink))
    try:
        got = []
        for _ in range(3):
            batches = wait_for(lambda: dp.get(timeout=1.0), what="an answer's batches")
            assert len(batches) == 4
            for batch in batches:
                d = batch.data
                assert d["obs"].shape == (16, 4) and d["obs"].dtype.is_floating_point
                assert str(d["action"].dtype) == "torch.int64"
                assert str(d["terminated"].dtype) == "torch.bool"
                ids = d["obs"][:, 0].numpy()
                assert np.all((ids >= 0) & (ids < 4 * 128)) and np.all(ids == ids.round())
                assert np.array_equal(d["next_obs"][:, 0].numpy(), ids + 0.5)
                assert np.array_equal(d["reward"].numpy(), ids)
                assert np.array_equal(d["action"].numpy(), ids % 2)
                assert np.array_equal(d["terminated"].numpy(), ids % 7 == 0)
                assert batch.weights is None and batch.item_refs == []
                # every answer names its items (the batch log's samples), prioritized or not:
                # a fresh buffer's item ids are its insertion order, the rows' own ids here
                [(buffer, item_ids, part)] = batch.samples
                assert buffer == "replay" and part == slice(0, 16)
                assert np.array_equal(item_ids, ids.astype(np.int64))
                got.append(ids.copy())  # the slot is reused once the next get() returns
        assert len(np.unique(np.concatenate(got))) > 100  # sampled, not one row over again
        s = c.status()
        assert s["counters"]["granted_batches"] >= 12
        assert dp.fetch_s > 0 and dp.sample_wait_s > 0
    finally:
        dp.close()
    assert dp._proc is not None and dp._proc.returncode == 0
    assert _own_files(dp) == []


def test_a_games_action_masks_ride_along_row_for_row(coordinator, task_sink):
    c = coordinator()
    dp = _data_process(c, _fed(c, task_sink, masks=True))
    try:
        batches = wait_for(lambda: dp.get(timeout=1.0), what="an answer's batches")
        for batch in batches:
            d = batch.data
            ids = d["obs"][:, 0].numpy().astype(np.int64)
            bits = (ids[:, None] >> np.arange(9) & 1).astype(bool)
            assert str(d["action_mask"].dtype) == "torch.bool"
            assert np.array_equal(d["action_mask"].numpy(), bits)
            assert np.array_equal(d["next_action_mask"].numpy(), ~bits)
    finally:
        dp.close()


def test_a_prioritized_answer_carries_weights_and_item_ids(coordinator, task_sink):
    c = coordinator(**PRIORITIZED)
    dp = _data_process(c, _fed(c, task_sink))
    try:
        batches = wait_for(lambda: dp.get(timeout=1.0), what="an answer's batches")
        for batch in batches:
            assert batch.weights is not None and batch.weights.shape == (16,)
            assert float(batch.weights.max()) == pytest.approx(1.0)  # normalised IS weights
            [(buffer, item_ids, part)] = batch.item_refs
            assert buffer == "replay" and part == slice(0, 16)
            # a fresh buffer's item ids are its insertion order: the rows' own ids here
            assert np.array_equal(item_ids, batch.data["obs"][:, 0].numpy().astype(np.int64))
    finally:
        dp.close()


def test_a_learner_that_takes_nothing_holds_the_data_process_back(coordinator, task_sink):
    c = coordinator()
    dp = _data_process(c, _fed(c, task_sink), depth=2)
    try:
        # three slots (depth + the one being learned from) fill, and nothing more is
        # sampled: sampled batches count as learned for the rate limiter
        wait_for(lambda: dp.ready.qsize() == 3, what="three answers ready")
        assert c.status()["counters"]["granted_batches"] == 12
        assert dp.get(timeout=1.0) is not None
        assert c.status()["counters"]["granted_batches"] == 12  # that slot is in use
        assert dp.get(timeout=1.0) is not None  # hands the first slot back
        wait_for(lambda: c.status()["counters"]["granted_batches"] == 16,
                 what="one more answer once a slot came back")
        wait_for(lambda: dp.ready.qsize() == 2, what="it ready")
    finally:
        dp.close()


def test_the_run_ending_reaches_the_learner(coordinator, task_sink):
    c = coordinator()
    dp = _data_process(c, _fed(c, task_sink))
    try:
        ok(post(c, "/run/stop", {}))
        while dp.get(timeout=0.2) is not None:  # what was sampled before is still learned
            pass
        wait_for(dp.stop_run.is_set, what="stop_run")
    finally:
        dp.close()


def test_a_data_process_that_dies_is_reported_and_leaves_no_files(coordinator, task_sink):
    c = coordinator()
    dp = _data_process(c, _fed(c, task_sink))
    try:
        wait_for(lambda: dp.ready.qsize() >= 1, what="an answer")
        assert dp._proc is not None
        os.kill(dp._proc.pid, signal.SIGKILL)
        with pytest.raises(DataProcessError, match="exited with code -9"):
            wait_for(lambda: dp.get(timeout=0.2) is None and False, timeout_s=10,
                     what="the exit to show")
    finally:
        dp.close()
    assert _own_files(dp) == []


def _stacked_chunk(start: int, n: int, stack: int = 4) -> dict[str, np.ndarray]:
    """Rows of one frame-stacked run: frame t has t in its first two pixels; row t's obs
    is frames t..t+S-1 and its next_obs frames t+1..t+S; reward is t. Packed, as a
    collector stores stacked frames."""
    t = np.arange(start, start + n + stack, dtype=np.int64)
    frames = np.zeros((len(t), 6, 6), np.uint8)
    frames[:, 0, 0], frames[:, 0, 1] = t % 256, t // 256
    rows = np.arange(n)[:, None] + np.arange(stack)[None, :]
    cut = np.zeros(n, bool)
    cut[-1] = True
    return pack({"obs": frames[rows], "next_obs": frames[rows + 1],
                 "reward": t[:n].astype(np.float32), "action": np.zeros(n, np.int64),
                 "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool), "cut": cut})


def test_stacked_frames_cross_once_as_one_stack_a_row(coordinator, task_sink):
    """Packed Atari-style chunks: each row travels as S+1 frames (`obs_stack`), and the
    learner's views of it are exactly the obs and next_obs the env returned."""
    c = coordinator()
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    store = DirectoryStorage(c.storage_dir)
    chunks = []
    for k in range(4):  # 512 rows: past the buffer's minimum
        chunk_id = uuid.uuid4().hex
        store.put_chunk(chunk_id, encode_arrays(_stacked_chunk(1000 * k, 128),
                                                {"policy_version": "-1"}))
        chunks.append((chunk_id, 128))
    ok(report(c, col["worker_id"], collect["task_id"], chunks))
    dp = _data_process(c, lrn)
    try:
        batches = wait_for(lambda: dp.get(timeout=1.0), what="an answer's batches")
        for batch in batches:
            assert set(batch.data) >= {OBS_STACK, "reward"} and "obs" not in batch.data
            assert batch.data[OBS_STACK].shape == (16, 5, 6, 6)
            data = expand_stacks(dict(batch.data))
            t = data["reward"].numpy().astype(np.int64)
            got = (data["obs"][:, :, 0, 0].numpy().astype(np.int64)
                   + 256 * data["obs"][:, :, 0, 1].numpy().astype(np.int64))
            assert np.array_equal(got, t[:, None] + np.arange(4))
            nxt = (data["next_obs"][:, :, 0, 0].numpy().astype(np.int64)
                   + 256 * data["next_obs"][:, :, 0, 1].numpy().astype(np.int64))
            assert np.array_equal(nxt, t[:, None] + 1 + np.arange(4))
    finally:
        dp.close()
