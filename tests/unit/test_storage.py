"""shared/infra/storage: the same contract for the directory and the Redis backend."""

from __future__ import annotations

import os
import threading
import uuid

import numpy as np
import pytest

from rlfleet.shared.contract.codec import decode_arrays, encode_arrays
from rlfleet.shared.infra.storage import (
    ChunkNotFound,
    DirectoryStorage,
    RedisStorage,
    Storage,
    StorageError,
    VersionConflict,
    open_storage,
    validate_id,
)

from .helpers import REDIS_URL, closed_port

BAD_IDS = ["../x", "..", "a/b", "/etc/passwd", "", ".hidden", "-x", "a b", "x" * 129,
           "a\nb", "a:b", "é"]


def _chunk(n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return encode_arrays({"obs": rng.standard_normal((n, 4)).astype(np.float32),
                          "reward": np.full(n, seed, np.float32)}, {"seed": str(seed)})


# -- chunks -------------------------------------------------------------------------------

def test_put_get_round_trips_bytes(storage: Storage):
    blobs = {f"c{i}": _chunk(5 + i, seed=i) for i in range(4)}
    storage.put_chunks(blobs)
    assert storage.get_chunks(["c2", "c0", "c3"]) == [blobs["c2"], blobs["c0"], blobs["c3"]]
    assert storage.get_chunk("c1") == blobs["c1"]
    arrays, meta = decode_arrays(storage.get_chunk("c3"))
    assert meta == {"seed": "3"} and arrays["reward"].shape == (8,)


def test_put_chunk_and_empty_batches(storage: Storage):
    storage.put_chunk("only", b"\x00\x01binary\xff")
    assert storage.get_chunk("only") == b"\x00\x01binary\xff"
    storage.put_chunks({})
    assert storage.get_chunks([]) == []
    assert storage.delete_chunks([]) == 0
    assert storage.list_chunks() == ["only"]


def test_list_chunks_is_sorted_and_complete(storage: Storage):
    assert storage.list_chunks() == []
    ids = [uuid.uuid4().hex for _ in range(20)]
    storage.put_chunks({i: b"x" for i in ids})
    assert storage.list_chunks() == sorted(ids)


def test_delete_chunks_counts_only_existing(storage: Storage):
    storage.put_chunks({"a": b"1", "b": b"2", "c": b"3"})
    assert storage.delete_chunks(["a", "c", "never-written"]) == 2
    assert storage.list_chunks() == ["b"]
    assert storage.delete_chunks(["a"]) == 0
    with pytest.raises(ChunkNotFound):
        storage.get_chunk("a")


def test_missing_chunk_raises_chunk_not_found_naming_the_id(storage: Storage):
    storage.put_chunk("present", b"p")
    with pytest.raises(ChunkNotFound) as info:
        storage.get_chunks(["present", "absent-7", "absent-8"])
    assert info.value.chunk_id == "absent-7"
    assert "absent-7" in str(info.value)
    assert isinstance(info.value, KeyError)


def test_overwriting_a_chunk_id_keeps_one_entry(storage: Storage):
    storage.put_chunk("same", b"first")
    storage.put_chunk("same", b"second")
    assert storage.get_chunk("same") == b"second"
    assert storage.list_chunks() == ["same"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_invalid_ids_are_rejected_everywhere(storage: Storage, bad: str):
    with pytest.raises(ValueError, match="chunk id"):
        storage.put_chunk(bad, b"x")
    with pytest.raises(ValueError, match="chunk id"):
        storage.get_chunk(bad)
    with pytest.raises(ValueError, match="chunk id"):
        storage.delete_chunks([bad])
    assert storage.list_chunks() == []


def test_path_traversal_writes_nothing_outside(tmp_path):
    store = DirectoryStorage(tmp_path / "root")
    with pytest.raises(ValueError):
        store.put_chunks({"ok": b"1", "../escape": b"2"})
    assert not (tmp_path / "root" / "escape.safetensors").exists()
    assert not list(tmp_path.glob("escape*"))


def test_validate_id():
    assert validate_id("abc-DEF_1.2") == "abc-DEF_1.2"
    for bad in [*BAD_IDS, None, 3]:
        with pytest.raises(ValueError):
            validate_id(bad)


# -- weights ------------------------------------------------------------------------------

def test_no_weights_before_first_publish(storage: Storage):
    assert storage.latest_version() is None
    assert storage.get_weights() is None
    assert storage.get_weights(0) is None


def test_publish_and_read_versions(storage: Storage):
    storage.put_weights(0, b"w0")
    assert storage.latest_version() == 0
    assert storage.get_weights() == (0, b"w0")
    storage.put_weights(1, b"w1")
    assert storage.latest_version() == 1
    assert storage.get_weights() == (1, b"w1")
    assert storage.get_weights(0) == (0, b"w0")
    assert storage.get_weights(5) is None


def test_a_version_is_never_published_twice(storage: Storage):
    """A learner that hung and woke up outside its group may try to publish a version the
    new publisher already did: refused, and the published bytes stay."""
    storage.put_weights(4, b"new publisher")
    with pytest.raises(VersionConflict, match="not newer"):
        storage.put_weights(4, b"woken learner")
    with pytest.raises(VersionConflict):
        storage.put_weights(2, b"older still")
    assert storage.get_weights() == (4, b"new publisher")
    storage.put_weights(4, b"new publisher")  # its own retried call succeeds
    storage.put_weights(5, b"next")
    assert storage.latest_version() == 5


def test_pruning_keeps_the_newest_versions(storage: Storage):
    keep = storage.keep_weight_versions
    assert keep >= 1
    total = keep + 3
    for v in range(total):
        storage.put_weights(v, f"w{v}".encode())
    assert storage.latest_version() == total - 1
    kept = [v for v in range(total) if storage.get_weights(v) is not None]
    assert kept == list(range(total - keep, total))
    for v in kept:
        assert storage.get_weights(v) == (v, f"w{v}".encode())
    assert storage.get_weights(0) is None


def test_pruning_honours_a_smaller_keep(storage: Storage):
    storage.keep_weight_versions = 1
    for v in range(3):
        storage.put_weights(v, b"x")
    assert storage.get_weights(1) is None
    assert storage.get_weights() == (2, b"x")


def test_weights_and_chunks_do_not_collide(storage: Storage):
    storage.put_weights(3, b"weights")
    storage.put_chunk("3", b"chunk")
    assert storage.get_weights(3) == (3, b"weights")
    assert storage.get_chunk("3") == b"chunk"
    assert storage.list_chunks() == ["3"]


def test_big_binary_blob_round_trips(storage: Storage):
    blob = np.random.default_rng(0).bytes(3 * 1024 * 1024)
    storage.put_chunk("big", blob)
    storage.put_weights(0, blob)
    assert storage.get_chunk("big") == blob
    assert storage.get_weights(0) == (0, blob)


# -- the coordinator's journal -------------------------------------------------------------

def test_journal_round_trips_records_in_append_order(storage: Storage):
    first = [b"a", b"\x00binary\xff", b""]
    storage.append_journal(3, first)
    storage.append_journal(3, [b"d"])
    storage.append_journal(3, [])
    assert storage.read_journal(3) == [*first, b"d"]
    assert storage.journal_generations() == [3]


def test_journal_generations_are_listed_ascending_and_kept_apart(storage: Storage):
    for generation in (12, 2, 7, 100):
        storage.append_journal(generation, [f"g{generation}".encode()])
    storage.append_journal(7, [b"g7-again"])
    assert storage.journal_generations() == [2, 7, 12, 100]
    assert storage.read_journal(7) == [b"g7", b"g7-again"]
    assert storage.read_journal(100) == [b"g100"]


def test_delete_journals_drops_only_lower_generations(storage: Storage):
    for generation in (1, 2, 3, 4):
        storage.append_journal(generation, [b"x"])
    storage.delete_journals(before=3)
    assert storage.journal_generations() == [3, 4]
    assert storage.read_journal(1) == [] and storage.read_journal(2) == []
    assert storage.read_journal(3) == [b"x"]
    storage.delete_journals(before=0)
    assert storage.journal_generations() == [3, 4]
    storage.delete_journals(before=10)
    assert storage.journal_generations() == []


def test_an_empty_journal_reads_as_no_records(storage: Storage):
    assert storage.read_journal(0) == []
    assert storage.journal_generations() == []
    storage.delete_journals(before=5)  # nothing to delete is fine


def test_journal_records_are_not_chunks_or_blobs(storage: Storage):
    storage.append_journal(0, [b"record"])
    storage.put_chunk("c", b"chunk")
    assert storage.list_chunks() == ["c"]
    assert storage.read_journal(0) == [b"record"]


def test_journal_appends_from_many_threads_keep_every_batch_whole(storage: Storage):
    def append(t: int) -> None:
        for i in range(20):
            storage.append_journal(1, [f"{t}-{i}-a".encode(), f"{t}-{i}-b".encode()])

    threads = [threading.Thread(target=append, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    records = storage.read_journal(1)
    assert len(records) == 4 * 20 * 2
    for a, b in zip(records[::2], records[1::2], strict=True):  # a call's records stay together
        assert a.endswith(b"-a") and b == a[:-1] + b"b"
    for t in range(4):  # and each thread's calls stay in order
        mine = [r for r in records[::2] if r.startswith(f"{t}-".encode())]
        assert mine == [f"{t}-{i}-a".encode() for i in range(20)]


@pytest.mark.parametrize("cut", [1, 4, 8, 9, 12], ids=lambda n: f"cut{n}")
def test_directory_journal_drops_a_torn_last_record(tmp_path, cut: int):
    """A crash mid-append leaves part of the last frame (header 8 bytes, then the payload):
    reading returns the whole records before it, and the next append is not hidden by it."""
    store = DirectoryStorage(tmp_path)
    store.append_journal(5, [b"one", b"two"])
    whole = store.journal_path(5).stat().st_size
    store.append_journal(5, [b"three-three"])  # an 8-byte header plus 11 bytes
    os.truncate(store.journal_path(5), whole + cut)
    assert store.read_journal(5) == [b"one", b"two"]

    restarted = DirectoryStorage(tmp_path)  # a new process going on with generation 5
    assert restarted.read_journal(5) == [b"one", b"two"]
    restarted.append_journal(5, [b"four"])
    assert restarted.read_journal(5) == [b"one", b"two", b"four"]


def test_directory_journal_stops_at_a_corrupt_record(tmp_path):
    store = DirectoryStorage(tmp_path)
    store.append_journal(0, [b"good", b"flipped", b"after"])
    data = bytearray(store.journal_path(0).read_bytes())
    data[8 + 4 + 8 + 2] ^= 0xFF  # a byte of the second payload
    store.journal_path(0).write_bytes(bytes(data))
    assert store.read_journal(0) == [b"good"]


def test_redis_journal_keys_live_under_the_run_prefix(redis_storage: RedisStorage):
    redis_storage.append_journal(4, [b"r"])
    keys = {k.decode() for k in redis_storage.client.keys(f"{redis_storage.prefix}*")}
    assert keys == {redis_storage.key_journal(4), redis_storage.key_journals}
    redis_storage.clear()
    assert redis_storage.journal_generations() == []


# -- backends -----------------------------------------------------------------------------

def test_redis_namespaces_are_isolated(redis_storage: RedisStorage):
    other = RedisStorage(REDIS_URL, namespace=f"other-{uuid.uuid4().hex}")
    try:
        redis_storage.put_chunk("a", b"mine")
        redis_storage.put_weights(0, b"w")
        assert other.list_chunks() == []
        assert other.latest_version() is None
        with pytest.raises(ChunkNotFound):
            other.get_chunk("a")
    finally:
        other.clear()
        other.close()


def test_redis_clear_removes_every_key(redis_storage: RedisStorage):
    redis_storage.put_chunks({f"c{i}": b"x" for i in range(5)})
    redis_storage.put_weights(0, b"w")
    redis_storage.clear()
    assert redis_storage.client.keys(f"{redis_storage.prefix}*") == []
    assert redis_storage.list_chunks() == []
    assert redis_storage.latest_version() is None


def test_directory_storage_writes_nothing_half_done(tmp_path):
    store = DirectoryStorage(tmp_path)
    store.put_chunks({"a": b"1", "b": b"2"})
    store.put_weights(0, b"w")
    leftovers = [p.name for p in tmp_path.rglob(".*.tmp")]
    assert leftovers == []


def test_directory_storage_on_a_file_raises_storage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="cannot create storage directory"):
        DirectoryStorage(blocker)


@pytest.mark.parametrize("call", [
    lambda s: s.put_chunks({"a": b"1"}),
    lambda s: s.get_chunks(["a"]),
    lambda s: s.delete_chunks(["a"]),
    lambda s: s.list_chunks(),
    lambda s: s.put_weights(0, b"w"),
    lambda s: s.latest_version(),
    lambda s: s.get_weights(),
    lambda s: s.clear(),
    lambda s: s.append_journal(0, [b"r"]),
    lambda s: s.read_journal(0),
    lambda s: s.journal_generations(),
    lambda s: s.delete_journals(5),
], ids=["put_chunks", "get_chunks", "delete_chunks", "list_chunks", "put_weights",
        "latest_version", "get_weights", "clear", "append_journal", "read_journal",
        "journal_generations", "delete_journals"])
def test_unreachable_redis_raises_storage_error(call):
    url = f"redis://127.0.0.1:{closed_port()}/0"
    # A short retry window: this is about the error, tests/unit/test_storage_outage.py
    # about riding out an outage.
    store = RedisStorage(url, namespace="unreachable", retry_s=0.05)
    try:
        with pytest.raises(StorageError) as info:
            call(store)
    finally:
        store.close()
    assert url in str(info.value)
    assert not isinstance(info.value, KeyError)


def test_open_storage_picks_the_backend(tmp_path):
    d = open_storage(str(tmp_path / "plain"))
    assert isinstance(d, DirectoryStorage) and d.root == tmp_path / "plain"
    f = open_storage(f"file://{tmp_path / 'viafile'}")
    assert isinstance(f, DirectoryStorage) and f.root == tmp_path / "viafile"
    ns = f"open-{uuid.uuid4().hex}"
    r = open_storage(REDIS_URL, namespace=ns)
    try:
        assert isinstance(r, RedisStorage)
        assert r.prefix == f"rlfleet:{ns}:"
        r.put_chunk("x", b"1")
        assert r.get_chunk("x") == b"1"
    finally:
        r.clear()
        r.close()
    assert isinstance(open_storage("unix:///tmp/redis.sock"), RedisStorage)
    assert isinstance(open_storage("rediss://127.0.0.1:6380/0"), RedisStorage)
