"""shared/replay/buffers/sequence.py (SequenceBuffer, R2D2's replay) and the learner's plumbing
for its batches (learner/feed/sampling.py, shared/batching/batching.py, learner/feed/dataproc.py).

Statistical tests use fixed seeds, so each outcome is deterministic; the thresholds say what
"follows the distribution" means (see tests/unit/test_prioritized.py for the chi-square
quantile and why stratified draws make the test conservative).
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest

from rlfleet.shared.algos.spec import SAMPLED_KINDS
from rlfleet.shared.contract.codec import decode_arrays, encode_arrays
from rlfleet.shared.contract.config import BufferConfig, ConfigError
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.sampling import SamplePart, SampleRequest, SampleResponse
from rlfleet.shared.replay.buffers import SequenceBuffer, make_buffer
from rlfleet.shared.replay.buffers.base import ChunkInfo, SampleError
from rlfleet.shared.replay.buffers.sequence import sequence_starts
from rlfleet.shared.replay.replay import Replay
from rlfleet.shared.run.config import parse_config

from .helpers import buffer_config, make_config

CHI2_999_DF49 = 85.351  # chi2.ppf(0.999, 49)


def chunk(chunk_id: str, length: int, segments: tuple = (), version: int = 0) -> ChunkInfo:
    return ChunkInfo(chunk_id, length, version, tuple(segments))


def sequences(capacity: int = 10_000, L: int = 4, overlap: int = 0, seed: int = 0,
              **kwargs) -> SequenceBuffer:
    return SequenceBuffer("seq", capacity, seed, sequence_length=L, sequence_overlap=overlap,
                          **kwargs)


def reference(info: ChunkInfo, L: int, overlap: int) -> list[tuple[int, int]]:
    """(start row, valid rows) of every sequence of a chunk, the slow obvious way."""
    out = []
    stride = L - overlap
    for start, n in sorted(info.segments or ((0, info.length),)):
        k = 0
        while n > 0 and (k == 0 or k * stride + overlap < n):
            out.append((start + k * stride, min(L, n - k * stride)))
            k += 1
    return out


def held(buf: SequenceBuffer) -> list[tuple[str, int, int]]:
    """(chunk id, start row, valid rows) of every sequence held, oldest first."""
    names = buf.table.names(buf.seq_chunk)
    return list(zip(names, buf.seq_start.tolist(), buf.seq_valid.tolist(), strict=True))


def random_segments(rng: np.random.Generator, length: int) -> tuple[tuple[int, int], ...]:
    """Cut `length` rows into runs of 1..30 rows (many shorter than a sequence), now and
    then with an empty run between them."""
    cuts, row = [], 0
    while row < length:
        if rng.random() < 0.05:
            cuts.append((row, 0))
        n = min(int(rng.integers(1, 31)), length - row)
        cuts.append((row, n))
        row += n
    return tuple(cuts)


def monitor_fields(buf) -> dict:
    m = buf.monitor
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name != "_window"}


def assert_same_refs(a, b) -> None:
    assert a.chunk_ids == b.chunk_ids
    for key in ("chunk_index", "rows", "item_ids", "weights"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
    assert a.sequence_length == b.sequence_length


# -- which sequences a segment holds ---------------------------------------------------------

@pytest.mark.parametrize("L,overlap,n,starts", [
    (4, 0, 0, []),                    # an empty segment holds nothing
    (4, 0, 1, [0]),                   # shorter than L: one padded sequence
    (4, 0, 3, [0]),
    (4, 0, 4, [0]),                   # exactly L
    (4, 0, 5, [0, 4]),                # L + 1: a second sequence of one valid row
    (4, 0, 8, [0, 4]),
    (4, 0, 9, [0, 4, 8]),
    (80, 40, 10, [0]),                # R2D2's: an early, short CartPole episode
    (80, 40, 80, [0]),
    (80, 40, 81, [0, 40]),            # row 80 is new: the second sequence is for it
    (80, 40, 120, [0, 40]),
    (80, 40, 121, [0, 40, 80]),
    (5, 4, 5, [0]),                   # stride 1
    (5, 4, 7, [0, 1, 2]),
    (1, 0, 3, [0, 1, 2]),             # sequences of one row: every row
])
def test_sequence_starts_follow_the_stride_and_overlap(L, overlap, n, starts):
    assert sequence_starts(n, L, overlap).tolist() == starts
    buf = sequences(L=L, overlap=overlap)
    info = chunk("a", max(n, 1), ((0, n),))
    buf.insert([info], 0)
    assert [(s, v) for _, s, v in held(buf)] == reference(info, L, overlap)
    assert buf.seq_start.tolist() == starts
    assert buf.seq_valid.tolist() == [min(L, n - s) for s in starts]


def test_several_segments_and_chunks_without_segments():
    L, overlap = 4, 1  # stride 3
    infos = [chunk("a", 30, ((0, 2), (2, 4), (6, 5), (11, 0), (11, 19))),
             chunk("b", 10),                               # no segments: one run of 10
             chunk("c", 20, ((10, 7), (0, 3)))]            # any order, gaps allowed
    buf = sequences(L=L, overlap=overlap)
    buf.insert(infos, 0)
    expected = [(i.chunk_id, s, v) for i in infos for s, v in reference(i, L, overlap)]
    assert held(buf) == expected
    assert held(buf)[:7] == [("a", 0, 2), ("a", 2, 4), ("a", 6, 4), ("a", 9, 2),
                             ("a", 11, 4), ("a", 14, 4), ("a", 17, 4)]
    assert ("b", 0, 4) in expected and ("b", 6, 4) in expected and ("b", 9, 1) not in expected
    # item ids: unique, increasing, contiguous per chunk in insert order
    assert buf.seq_uid.tolist() == list(range(len(expected)))
    assert buf.ch_sequences.tolist() == [sum(1 for e in expected if e[0] == c) for c in "abc"]
    assert len(buf) == 60 and buf.monitor.inserted_items == 60
    stats = buf.stats()
    assert stats["sequences"] == len(expected) and stats["chunks"] == 3
    assert stats["padded_sequences"] == sum(1 for e in expected if e[2] < L)
    assert stats["valid_fraction"] == pytest.approx(np.mean([e[2] for e in expected]) / L)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_no_sequence_crosses_an_episode_end(seed):
    """Over random chunks, L and overlaps: every sequence's valid rows lie inside one
    segment, a padded one ends exactly at its segment's end, the sequences cover every row
    of every segment, and what sampling hands out is what is held."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 12))
    overlap = int(rng.integers(0, L))
    buf = sequences(L=L, overlap=overlap, seed=seed)
    infos = []
    for i in range(30):
        length = int(rng.integers(1, 120))
        segments = random_segments(rng, length) if i % 4 else ()
        infos.append(chunk(f"c{i}", length, segments))
    buf.insert(infos, 0)
    by_id = {i.chunk_id: i for i in infos}
    for cid, start, valid in held(buf):
        runs = by_id[cid].segments or ((0, by_id[cid].length),)
        [(s, n)] = [(s, n) for s, n in runs if s <= start < s + n]
        assert 1 <= valid <= L and start + valid <= s + n, (cid, start, valid, s, n)
        assert valid == L or start + valid == s + n  # padding only at a segment's end
    for info in infos:
        covered = np.zeros(info.length, dtype=bool)
        for cid, start, valid in held(buf):
            if cid == info.chunk_id:
                covered[start:start + valid] = True
        for s, n in info.segments or ((0, info.length),):
            assert covered[s:s + n].all()
    refs = buf.sample(64, 8, train_iteration=0, policy_version=0)
    pos = np.searchsorted(buf.seq_uid, refs.item_ids.reshape(-1))
    assert (buf.seq_uid[pos] == refs.item_ids.reshape(-1)).all()
    names = [refs.chunk_ids[i] for i in refs.chunk_index.reshape(-1).tolist()]
    assert names == buf.table.names(buf.seq_chunk[pos])
    np.testing.assert_array_equal(refs.rows.reshape(-1), buf.seq_start[pos])


def test_an_empty_chunk_is_released_at_once():
    buf = sequences()
    assert buf.insert([chunk("e", 3, ((0, 0),))], 0) == ["e"]
    assert buf.release_reasons == {"e": "dropped/empty"} and buf.chunk_ids() == set()
    assert buf.monitor.dropped["empty"] == 3 and buf.monitor.released_chunks == 1


@pytest.mark.parametrize("kwargs,match", [
    ({"L": 0}, "sequence_length=0"), ({"L": 4, "overlap": 4}, "sequence_overlap=4"),
    ({"L": 4, "overlap": -1}, "sequence_overlap=-1"), ({"capacity": 0}, "capacity=0")])
def test_bad_shapes_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sequences(**kwargs)


def test_bad_segments_are_refused_before_anything_changes():
    buf = sequences()
    with pytest.raises(ValueError, match="chunk bad"):
        buf.insert([chunk("good", 10), chunk("bad", 10, ((0, 5), (4, 3)))], 0)
    assert len(buf) == 0 and buf.chunk_ids() == set() and buf.num_sequences == 0


# -- sampling and priorities ------------------------------------------------------------------

def fifty(alpha: float = 0.6, L: int = 4, **kwargs) -> tuple[SequenceBuffer, np.ndarray]:
    """50 sequences (uid i starts at row i*L) with priorities 1..50; returns P(i)."""
    buf = sequences(L=L, alpha=alpha, seed=1234, **kwargs)
    buf.insert([chunk("a", 50 * L)], 0)
    priorities = np.arange(1, 51, dtype=np.float64)
    assert buf.update_priorities(np.arange(50), priorities) == 50
    scaled = (priorities + buf.eps) ** alpha
    return buf, scaled / scaled.sum()


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_sampling_frequencies_follow_priorities_to_the_alpha(alpha):
    buf, probs = fifty(alpha)
    refs = buf.sample(500, 40, train_iteration=0, policy_version=0)  # 20,000 draws
    counts = np.bincount(refs.item_ids.reshape(-1), minlength=50)
    expected = counts.sum() * probs
    assert ((counts - expected) ** 2 / expected).sum() < CHI2_999_DF49
    np.testing.assert_array_equal(refs.rows, refs.item_ids * 4)
    assert buf.monitor.sampled_items == 20_000 * 4  # sequences x L, like the episode buffer
    assert buf.use_counts().sum() == 20_000


def test_every_batch_of_a_request_spans_the_priorities():
    buf, probs = fifty(1.0)
    refs = buf.sample(1000, 4, 0, 0)
    for b in range(4):
        counts = np.bincount(refs.item_ids[b], minlength=50)
        expected = 1000 * probs
        assert ((counts - expected) ** 2 / expected).sum() < CHI2_999_DF49


def test_zero_priorities_are_never_sampled_when_eps_is_zero():
    buf = sequences(L=2, priority_eps=0.0)
    buf.insert([chunk("a", 20)], 0)
    buf.update_priorities(np.arange(10), np.array([0, 1] * 5, dtype=np.float64))
    refs = buf.sample(1000, 2, 0, 0)
    assert set(refs.item_ids.reshape(-1).tolist()) == {1, 3, 5, 7, 9}
    assert np.allclose(refs.weights, 1.0)  # equal probabilities: equal weights
    buf.update_priorities(np.arange(10), np.zeros(10))
    with pytest.raises(SampleError, match="no sequence with positive priority"):
        buf.sample(1, 1, 0, 0)


@pytest.mark.parametrize("train_iteration,beta", [(0, 0.4), (500, 0.7), (1000, 1.0),
                                                  (5000, 1.0)])
def test_importance_weights_follow_the_formula_with_annealed_beta(train_iteration, beta):
    buf = sequences(L=3, alpha=0.7, beta=0.4, beta_final=1.0, beta_anneal_iterations=1000,
                    seed=5)
    buf.insert([chunk("a", 90), chunk("b", 60, ((0, 10), (10, 50)))], 0)
    n = buf.num_sequences
    rng = np.random.default_rng(9)
    priorities = rng.uniform(0.01, 20.0, size=n)
    buf.update_priorities(buf.seq_uid, priorities)
    assert buf.beta(train_iteration) == pytest.approx(beta)
    refs = buf.sample(32, 4, train_iteration=train_iteration, policy_version=0)
    scaled = (priorities + buf.eps) ** 0.7
    p = scaled / scaled.sum()
    expected = (n * p[refs.item_ids]) ** -beta / ((n * p) ** -beta).max()
    assert refs.weights is not None and refs.weights.dtype == np.float32
    assert refs.weights.shape == (4, 32)
    np.testing.assert_allclose(refs.weights, expected, rtol=1e-6)
    assert (refs.weights <= 1.0).all()
    assert buf.stats()["beta"] == pytest.approx(beta)


def test_new_sequences_get_the_largest_priority_seen_so_far():
    buf = sequences(L=2)
    buf.insert([chunk("a", 10)], 0)
    np.testing.assert_array_equal(buf.seq_priority, 1.0)  # nothing seen yet: priority 1
    buf.update_priorities(np.arange(5), np.linspace(0.5, 4.0, 5))
    assert buf.max_priority == 4.0 + buf.eps
    buf.insert([chunk("b", 6)], 0)
    np.testing.assert_array_equal(buf.seq_priority[5:], 4.0 + buf.eps)
    buf.update_priorities(np.arange(8), np.full(8, 0.1))  # lower everything
    buf.insert([chunk("c", 2)], 0)
    assert buf.seq_priority[-1] == 4.0 + buf.eps


def test_priority_updates_name_sequences_by_uid_and_stale_ones_are_ignored():
    buf = sequences(capacity=20, L=5)
    buf.insert([chunk("a", 10), chunk("b", 10)], 0)  # uids 0, 1 in a; 2, 3 in b
    assert buf.update_priorities(np.array([3, 0]), np.array([7.0, 2.0])) == 2
    np.testing.assert_array_equal(buf.seq_priority, [2.0 + buf.eps, 1.0, 1.0, 7.0 + buf.eps])
    assert buf.insert([chunk("c", 10)], 0) == ["a"]  # a's sequences 0 and 1 are gone
    assert buf.seq_uid.tolist() == [2, 3, 4, 5]
    before = buf.seq_priority.copy()
    # 0, 1: evicted; 99: never issued; -1: never an id
    assert buf.update_priorities(np.array([0, 1, 99, -1, 4]), np.full(5, 3.0)) == 1
    np.testing.assert_array_equal(buf.seq_priority, [*before[:2], 3.0 + buf.eps, before[3]])
    assert buf.monitor.priority_updates == 3 and buf.monitor.stale_priority_updates == 4
    assert buf.stats()["stale_priority_updates"] == 4
    # a repeated id takes its last priority
    buf.update_priorities(np.array([5, 5]), np.array([1.0, 9.0]))
    assert buf.seq_priority[-1] == 9.0 + buf.eps


@pytest.mark.parametrize("ids,priorities,match", [
    ([0, 1], [1.0], "2 item ids but 1 priorities"),
    ([0], [np.nan], "finite"), ([0], [-1.0], "non-negative")])
def test_invalid_priority_updates_raise_and_change_nothing(ids, priorities, match):
    buf = sequences(L=2)
    buf.insert([chunk("a", 10)], 0)
    before = (buf.seq_priority.copy(), monitor_fields(buf))
    with pytest.raises(ValueError, match=match):
        buf.update_priorities(np.array(ids), np.array(priorities))
    np.testing.assert_array_equal(buf.seq_priority, before[0])
    assert monitor_fields(buf) == before[1]


def test_sample_errors():
    buf = sequences()
    with pytest.raises(SampleError, match="is empty"):
        buf.sample(1, 1, 0, 0)
    buf.insert([chunk("a", 3)], 0)  # one padded sequence is enough to sample
    for size, batches in ((0, 1), (1, 0)):
        with pytest.raises(SampleError, match="must be at least 1"):
            buf.sample(size, batches, 0, 0)
    refs = buf.sample(5, 2, 0, 0)
    assert refs.rows.shape == refs.item_ids.shape == refs.weights.shape == (2, 5)
    assert refs.chunk_ids == ["a"] and refs.sequence_length == 4 and (refs.rows == 0).all()


def test_monitor_counts_staleness_and_policy_lag_per_sequence():
    buf = sequences(L=2)
    buf.insert([chunk("a", 4, version=3)], train_iteration=10)
    buf.sample(10, 1, train_iteration=14, policy_version=5)
    m = buf.monitor
    assert m.staleness_sum / m.staleness_count == 4 and m.lag_sum / m.lag_count == 2
    assert m.sampled_items == 20


# -- capacity and retried inserts ---------------------------------------------------------------

def test_eviction_is_whole_chunks_oldest_first_keeping_the_newest():
    buf = sequences(capacity=25, L=4)
    assert buf.insert([chunk("a", 10), chunk("b", 10)], 0) == []
    assert buf.insert([chunk("c", 5)], 0) == []  # exactly full: nothing goes
    assert buf.insert([chunk("d", 1)], 0) == ["a"]  # 26 rows: the oldest chunk goes
    assert buf.release_reasons == {}  # evicted: the replay's default reason
    assert buf.chunk_ids() == {"b", "c", "d"} and len(buf) == 16
    assert buf.monitor.evicted_items == 10 and buf.monitor.released_chunks == 1
    assert buf.table.names(buf.seq_chunk) == ["b"] * 3 + ["c"] * 2 + ["d"]
    assert buf.insert([chunk("big", 40)], 0) == ["b", "c", "d"]  # alone over capacity: kept
    assert buf.chunk_ids() == {"big"} and len(buf) == 40 and buf.num_sequences == 10
    assert buf.seq_uid.tolist() == list(range(9, 19))  # ids never reused


def test_a_retried_insert_is_ignored():
    buf = sequences(L=4)
    buf.insert([chunk("a", 10), chunk("a", 10)], 0)  # listed twice in one report
    state = (held(buf), buf.seq_uid.copy(), monitor_fields(buf))
    assert buf.insert([chunk("a", 10)], 5) == []  # and reported again later
    assert held(buf) == state[0]
    np.testing.assert_array_equal(buf.seq_uid, state[1])
    assert monitor_fields(buf) == state[2] and len(buf) == 10
    assert buf.chunk_occurrences() == ["a"]


# -- snapshots ------------------------------------------------------------------------------

def filled(seed: int = 11) -> SequenceBuffer:
    rng = np.random.default_rng(seed)
    buf = sequences(capacity=300, L=6, overlap=2, seed=seed, alpha=0.8, beta=0.5,
                    beta_anneal_iterations=50)
    for i in range(12):
        length = int(rng.integers(20, 60))
        buf.insert([chunk(f"c{i}", length, random_segments(rng, length), version=i)], i)
        refs = buf.sample(16, 2, train_iteration=i, policy_version=i)
        buf.update_priorities(refs.item_ids[0], rng.uniform(0, 5, size=16))
    buf.insert([chunk("empty", 2, ((0, 0),))], 12)
    return buf


def test_snapshot_restore_round_trips_exactly_and_samples_the_same_future():
    buf = filled()
    assert buf.table._free and buf.monitor.evicted_items > 0
    arrays, meta = buf.snapshot()
    arrays2, meta2 = decode_arrays(encode_arrays(arrays, meta))  # safetensors-ready
    assert meta2 == meta
    other = sequences(capacity=300, L=6, overlap=2, seed=999, alpha=0.8, beta=0.5,
                      beta_anneal_iterations=50)
    other.restore(arrays2, meta2)
    again_arrays, again_meta = other.snapshot()
    assert again_meta == meta and again_arrays.keys() == arrays.keys()
    for key in arrays:
        np.testing.assert_array_equal(again_arrays[key], arrays[key], err_msg=key)
        assert again_arrays[key].dtype == arrays[key].dtype, key
    assert other.stats() == buf.stats()
    rng = np.random.default_rng(0)
    for step in range(5):  # the rng state travelled too: both behave identically
        a = buf.sample(32, 3, 20 + step, 12)
        assert_same_refs(a, other.sample(32, 3, 20 + step, 12))
        prios = rng.uniform(0, 3, size=a.item_ids[0].size)
        assert (buf.update_priorities(a.item_ids[0], prios)
                == other.update_priorities(a.item_ids[0], prios))
        new = [chunk(f"n{step}", 40, ((0, 15), (15, 25)), version=13)]
        assert buf.insert(new, 20 + step) == other.insert(new, 20 + step)
    assert other.stats() == buf.stats()


def test_snapshot_does_not_share_memory_with_the_buffer():
    buf = filled()
    arrays, _ = buf.snapshot()
    uses, prios = arrays["seq_uses"].copy(), arrays["seq_priority"].copy()
    refs = buf.sample(64, 4, 30, 12)
    buf.update_priorities(refs.item_ids[0], np.full(64, 42.0))
    np.testing.assert_array_equal(arrays["seq_uses"], uses)
    np.testing.assert_array_equal(arrays["seq_priority"], prios)


def test_an_empty_buffer_round_trips():
    buf = sequences(L=2, seed=2)
    arrays, meta = decode_arrays(encode_arrays(*buf.snapshot()))
    other = sequences(L=2, seed=3)
    other.restore(arrays, meta)
    assert len(other) == 0 and other.chunk_ids() == set()
    for b in (buf, other):
        b.insert([chunk("a", 10)], 0)
    assert_same_refs(buf.sample(8, 1, 0, 0), other.sample(8, 1, 0, 0))


@pytest.mark.parametrize("kwargs", [{"capacity": 301}, {"L": 7}, {"overlap": 3}])
def test_restore_refuses_a_different_shape(kwargs):
    arrays, meta = filled().snapshot()
    args = {"capacity": 300, "L": 6, "overlap": 2, **kwargs}
    with pytest.raises(ValueError, match="cannot restore buffers.seq"):
        sequences(**args).restore(arrays, meta)


# -- config, make_buffer, rate limits -------------------------------------------------------

def test_make_buffer_builds_it_from_the_config():
    cfg = BufferConfig(kind="sequence", capacity=500, sequence_length=80, sequence_overlap=40,
                       alpha=0.9, beta=0.6, beta_final=0.8, beta_anneal_iterations=10)
    buf = make_buffer("replay", cfg, seed=0, priority_eps=1e-3)
    assert isinstance(buf, SequenceBuffer) and buf.kind == "sequence"
    assert (buf.capacity, buf.sequence_length, buf.sequence_overlap) == (500, 80, 40)
    assert (buf.alpha, buf.beta0, buf.beta_final, buf.anneal, buf.eps) == (0.9, 0.6, 0.8, 10,
                                                                           1e-3)
    assert "sequence" in SAMPLED_KINDS


@pytest.mark.parametrize("overlap", [4, 5])
def test_an_overlap_of_a_whole_sequence_is_a_config_error_naming_the_field(overlap):
    data = make_config(buffers={"replay": buffer_config(kind="sequence", sequence_length=4,
                                                        sequence_overlap=overlap)})
    with pytest.raises(ConfigError, match=r"'buffers\.replay\.sequence_overlap'") as info:
        parse_config(data)
    assert "less than sequence_length=4" in str(info.value)
    data["buffers"]["replay"]["sequence_overlap"] = 3
    assert parse_config(data).buffers["replay"].sequence_overlap == 3


def test_the_config_check_counts_sequence_length_items_per_sequence():
    data = make_config(buffers={"replay": buffer_config(
        kind="sequence", sequence_length=4,
        rate_limit={"samples_per_insert": 64, "error_buffer": 255})})
    with pytest.raises(ConfigError, match="smaller than the 256 items"):
        parse_config(data)  # 64 sequences x 4 rows
    data["buffers"]["replay"]["rate_limit"]["error_buffer"] = 256
    parse_config(data)


def test_the_replay_grants_batches_of_sequence_length_items_per_sequence():
    data = make_config(buffers={"replay": buffer_config(
        kind="sequence", sequence_length=5,
        rate_limit={"min_size": 100, "samples_per_insert": 1.0, "error_buffer": 40})},
        algo={"batch_size": 4})
    r = Replay(parse_config(data))
    plan = r.plan(SampleRequest(worker_id="learner-1", batch_size=4, num_batches=1))
    r.insert([ChunkMeta(chunk_id="c0", length=99, policy_version=0)], 0)
    assert r.grantable(plan, 1000) == 0  # under min_size
    r.insert([ChunkMeta(chunk_id="c1", length=11, policy_version=0, segments=[(0, 3),
                                                                             (3, 8)])], 0)
    # 110 rows inserted: 10 + 40 items of room, 20 items (4 sequences x 5 rows) a batch
    assert r.grantable(plan, 1000) == 2
    chunk_ids, parts, _ = r.sample(plan, 2, 0, 0)
    assert parts[0].sequence_length == 5 and parts[0].weights.shape == (2, 4)
    assert r.grantable(plan, 1000) == 0
    assert r.stats()["replay"]["sampled_items"] == 40
    assert r.stats()["replay"]["kind"] == "sequence"


# -- the learner: batches of sequences with their recurrent state -----------------------------

class _StatePolicy:
    """Acts at random and returns, as a recurrent policy would, the 'state' each env acted
    from: recurrent_h = (env, vector step, 1), recurrent_c = (vector step,), so each row
    says where it was collected."""

    version = 0

    def __init__(self, n_actions: int) -> None:
        self.rng = np.random.default_rng(0)
        self.n_actions = n_actions
        self.steps = 0

    def act(self, obs: np.ndarray, env_step: int):
        from rlfleet.shared.algos.base import ActOutput

        n = obs.shape[0]
        h = np.stack([np.arange(n), np.full(n, self.steps), np.ones(n)], 1).astype(np.float32)
        c = np.full((n, 1), -float(self.steps), dtype=np.float32)
        self.steps += 1
        return ActOutput(self.rng.integers(self.n_actions, size=n),
                         {"recurrent_h": h, "recurrent_c": c})

    def bootstrap(self, obs: np.ndarray) -> None:
        return None


@pytest.fixture(scope="module")
def rollout_chunks() -> list:
    """Three env-major CartPole chunks (4 envs x 16 steps each, random actions: episodes of
    about 20 steps, so many segments are shorter than a sequence)."""
    from rlfleet.shared.envs.make import make_vector_env
    from rlfleet.shared.rollout.rollout import Rollout

    cfg = parse_config(make_config())
    envs = make_vector_env(cfg.env, 4, seed=7)
    try:
        rollout = Rollout(envs, _StatePolicy(2), chunk_size=64)
        return [rollout.collect(0) for _ in range(3)]
    finally:
        envs.close()


def expected_rows(cut: np.ndarray, start: int, L: int) -> list[int]:
    """A sequence's rows in its chunk: start, start+1, ..., held at its run's last (cut) row
    from there on."""
    rows, row = [], start
    for _ in range(L):
        rows.append(row)
        if not cut[row]:
            row += 1
    return rows


def _sampled(rollout_chunks, L: int = 12, overlap: int = 6, batch: int = 24,
             num_batches: int = 3):
    chunks = {f"k{i}": c for i, c in enumerate(rollout_chunks)}
    buf = sequences(L=L, overlap=overlap, seed=4)
    buf.insert([ChunkInfo(cid, c.length, 0, tuple(tuple(s) for s in c.segments))
                for cid, c in chunks.items()], 0)
    assert buf.stats()["padded_sequences"] > 0, "the test wants padded sequences"
    refs = buf.sample(batch, num_batches, 0, 0)
    part = SamplePart(buffer="replay", chunk_index=refs.chunk_index.tolist(),
                      rows=refs.rows.tolist(), item_ids=refs.item_ids.tolist(),
                      weights=refs.weights.tolist(), sequence_length=L)
    resp = SampleResponse(chunk_ids=refs.chunk_ids, parts=[part], num_batches=num_batches,
                          env_steps=0)
    return chunks, refs, resp


def _expected(chunks, refs, L: int) -> dict[str, np.ndarray]:
    """Every field of every sampled sequence, row by row from the chunks themselves."""
    fields = ("obs", "action", "reward", "next_obs", "terminated", "cut", "recurrent_c",
              "recurrent_h")
    out = {f: [] for f in fields}
    for cidx, start in zip(refs.chunk_index.reshape(-1).tolist(),
                           refs.rows.reshape(-1).tolist(), strict=True):
        arrays = chunks[refs.chunk_ids[cidx]].arrays
        rows = expected_rows(arrays["cut"], start, L)
        for f in fields:
            out[f].append(arrays[f][rows])
    shape = refs.rows.shape + (L,)
    return {f: np.stack(v).reshape(shape + v[0].shape[1:]) for f, v in out.items()}


def _check(data: dict, expected: dict, refs, chunks, L: int) -> None:
    assert set(data) >= set(expected)
    for f, want in expected.items():
        got = np.asarray(data[f])
        assert got.shape == want.shape, f
        np.testing.assert_array_equal(got, want, err_msg=f)
    # the first row of each sequence is its start row: the state the collector acted from
    h = np.asarray(data["recurrent_h"])
    for b, i in np.ndindex(refs.rows.shape):
        arrays = chunks[refs.chunk_ids[refs.chunk_index[b, i]]].arrays
        np.testing.assert_array_equal(h[b, i, 0], arrays["recurrent_h"][refs.rows[b, i]])
    # a sequence's valid rows end at its first cut; padding after it repeats the cut row
    cut = np.asarray(data["cut"])
    assert not cut[..., -1].all(), "the test wants some unpadded sequences"
    first = np.argmax(cut, axis=-1)
    for b, i in np.ndindex(refs.rows.shape):
        if cut[b, i].any():
            assert cut[b, i, first[b, i]:].all()
            assert (h[b, i, first[b, i]:] == h[b, i, first[b, i]]).all()


def test_batch_fields_carry_cut_and_the_recurrent_state_where_chunks_have_it():
    from rlfleet.shared.batching.rows import DEFAULT_FIELDS, batch_fields

    assert batch_fields({"obs": 0, "cut": 0}) == DEFAULT_FIELDS
    assert batch_fields({"obs": 0, "recurrent_h": 0, "cut": 0, "recurrent_c": 0}) == (
        *DEFAULT_FIELDS, "cut", "recurrent_c", "recurrent_h")


def test_part_rows_clamps_padded_sequences_in_bounds():
    from types import SimpleNamespace

    from rlfleet.shared.batching.rows import part_rows

    part = SimpleNamespace(chunk_index=[[0, 1]], rows=[[1, 7]], sequence_length=4)
    offsets = np.array([0, 10])
    flat = part_rows(part, offsets, total_rows=20)  # no cut flags: only clamped
    assert flat.tolist() == [[[1, 2, 3, 4], [17, 18, 19, 19]]]
    cut = np.zeros(20, dtype=bool)
    cut[[2, 9, 12, 19]] = True
    assert part_rows(part, offsets, 20, cut).tolist() == [[[1, 2, 2, 2], [17, 18, 19, 19]]]
    transitions = SimpleNamespace(chunk_index=[[1]], rows=[[9]], sequence_length=None)
    assert part_rows(transitions, offsets, 20, cut).tolist() == [[19]]


@pytest.mark.parametrize("transforms", [None, "inactive", "active-elsewhere", "reward"])
def test_assemble_from_gives_sequences_with_their_state(rollout_chunks, transforms):
    from rlfleet.shared.batching.arena import ChunkArena
    from rlfleet.shared.batching.batching import assemble, assemble_from
    from rlfleet.shared.batching.rows import batch_fields
    from rlfleet.shared.batching.transforms import BatchTransforms

    L = 12
    chunks, refs, resp = _sampled(rollout_chunks, L=L)
    bt = {None: None, "inactive": BatchTransforms(),
          "active-elsewhere": BatchTransforms(rewards={"expert": 1.0}),
          "reward": BatchTransforms(rewards={"replay": 0.5})}[transforms]
    expected = _expected(chunks, refs, L)
    if transforms == "reward":
        expected["reward"] = np.full_like(expected["reward"], 0.5)
    arena = ChunkArena(lambda ids: [chunks[i].arrays for i in ids], capacity=8)
    offsets = arena.offsets(refs.chunk_ids)
    fields = batch_fields(arena.columns)
    assert fields[-3:] == ("cut", "recurrent_c", "recurrent_h")
    batches = assemble_from(arena.columns, offsets, resp.parts, resp.num_batches, fields,
                            transforms=bt)
    assert len(batches) == 3
    for b, batch in enumerate(batches):
        assert batch.data["obs"].shape == (24, L, 4) and batch.data["cut"].shape == (24, L)
        assert batch.data["recurrent_h"].shape == (24, L, 3)
        assert batch.weights.shape == (24,) and batch.item_refs[0][0] == "replay"
        np.testing.assert_array_equal(batch.item_refs[0][1], refs.item_ids[b])
    data = {f: np.stack([batch.data[f].numpy() for batch in batches]) for f in fields}
    _check(data, expected, refs, chunks, L)
    # the concatenated columns (no arena): the last chunk's padding would run off the end
    whole = assemble([chunks[c].arrays for c in refs.chunk_ids], resp.parts,
                     resp.num_batches, fields, transforms=bt)
    data = {f: np.stack([batch.data[f].numpy() for batch in whole]) for f in fields}
    _check(data, expected, refs, chunks, L)


@pytest.mark.parametrize("transforms", [None, "reward"])
def test_the_data_process_lays_out_sequences_with_their_state(rollout_chunks, transforms):
    from rlfleet.learner.feed.dataproc_child import ShmWriter
    from rlfleet.shared.batching.arena import ChunkArena
    from rlfleet.shared.batching.transforms import BatchTransforms

    L = 12
    chunks, refs, resp = _sampled(rollout_chunks, L=L)
    bt = None if transforms is None else BatchTransforms(rewards={"replay": 0.5})
    expected = _expected(chunks, refs, L)
    if transforms == "reward":
        expected["reward"] = np.full_like(expected["reward"], 0.5)
    writer = ShmWriter(None, None, "learner-1", 24, 3, 8, depth=1, out=io.StringIO(),
                       transforms=bt)
    arena = ChunkArena(lambda ids: [chunks[i].arrays for i in ids], capacity=8)
    offsets = arena.offsets(refs.chunk_ids)
    slot = writer.slots[0]
    try:
        message = writer._write(slot, resp, arena.columns, offsets)
        data = {}
        for name, (offset, dtype, shape) in message["layout"].items():
            count = int(np.prod(shape, dtype=np.int64))
            data[name] = np.frombuffer(slot.map, dtype=np.dtype(dtype), count=count,
                                       offset=offset).reshape(shape).copy()
    finally:
        slot.release()
    assert data["obs"].shape == (3, 24, L, 4) and data["recurrent_c"].shape == (3, 24, L, 1)
    np.testing.assert_array_equal(data["item_ids"], refs.item_ids)
    np.testing.assert_allclose(data["weights"], refs.weights)
    assert message["refs"] == [["replay", 0, 24]]
    _check(data, expected, refs, chunks, L)
