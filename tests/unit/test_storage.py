"""shared/storage: the same contract for the directory and the Redis backend."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from shared.codec import decode_arrays, encode_arrays
from shared.storage import (
    ChunkNotFound,
    DirectoryStorage,
    RedisStorage,
    Storage,
    StorageError,
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
], ids=["put_chunks", "get_chunks", "delete_chunks", "list_chunks", "put_weights",
        "latest_version", "get_weights", "clear"])
def test_unreachable_redis_raises_storage_error(call):
    url = f"redis://127.0.0.1:{closed_port()}/0"
    store = RedisStorage(url, namespace="unreachable")
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
