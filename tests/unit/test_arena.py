"""The learner's chunk arena: rows come back exactly, slots are reused least-recently-used
first, and it grows when a request or a chunk does not fit."""

from __future__ import annotations

import numpy as np

from rlfleet.shared.batching.arena import ChunkArena


def chunk(tag: int, n: int) -> dict[str, np.ndarray]:
    rows = np.arange(n)
    return {"obs": np.stack([rows + 1000 * tag, -rows], axis=1).astype(np.float32),
            "reward": (rows + 1000 * tag).astype(np.float32),
            "terminated": rows % 3 == 0}


def make(capacity: int, lengths: dict[str, int]):
    store = {cid: chunk(i, n) for i, (cid, n) in enumerate(lengths.items())}
    fetched: list[str] = []

    def fetch(ids):
        fetched.extend(ids)
        return [store[c] for c in ids]

    return ChunkArena(fetch, capacity), store, fetched


def rows_of(arena: ChunkArena, ids: list[str], rows: np.ndarray, field: str) -> np.ndarray:
    offsets = arena.offsets(ids)
    return arena.columns[field][offsets[np.arange(len(ids))] + rows]


def test_gathered_rows_equal_the_chunks_rows():
    arena, store, fetched = make(8, {f"c{i}": 5 for i in range(4)})
    ids = ["c2", "c0", "c3", "c2"]
    rows = np.array([4, 0, 2, 1])
    got = rows_of(arena, ids, rows, "obs")
    want = np.stack([store[c]["obs"][r] for c, r in zip(ids, rows, strict=True)])
    np.testing.assert_array_equal(got, want)
    assert sorted(fetched) == ["c0", "c2", "c3"]  # each chunk read once
    rows_of(arena, ["c0", "c2"], np.array([1, 1]), "reward")
    assert sorted(fetched) == ["c0", "c2", "c3"] and arena.hits >= 2


def test_least_recently_used_slots_are_reused_and_refetched_later():
    arena, store, fetched = make(2, {"a": 3, "b": 3, "c": 3})
    arena.offsets(["a"])
    arena.offsets(["b"])
    arena.offsets(["a"])  # a is now newer than b
    arena.offsets(["c"])  # evicts b
    assert "a" in arena and "c" in arena and "b" not in arena
    np.testing.assert_array_equal(rows_of(arena, ["b"], np.array([2]), "reward"),
                                  store["b"]["reward"][[2]])
    assert fetched == ["a", "b", "c", "b"]


def test_a_request_larger_than_capacity_and_a_longer_chunk_grow_the_arena():
    lengths = {f"s{i}": 4 for i in range(5)} | {"long": 9}
    arena, store, _ = make(2, lengths)
    ids = [f"s{i}" for i in range(5)]
    got = rows_of(arena, ids, np.array([3, 2, 1, 0, 3]), "obs")
    want = np.stack([store[c]["obs"][r] for c, r in zip(ids, [3, 2, 1, 0, 3], strict=True)])
    np.testing.assert_array_equal(got, want)
    assert arena.capacity >= 5
    # a longer chunk regrows every slot, keeping what was held
    got = rows_of(arena, ["long", "s1"], np.array([8, 3]), "terminated")
    np.testing.assert_array_equal(got, [store["long"]["terminated"][8],
                                        store["s1"]["terminated"][3]])
    assert arena.slot_rows == 9
