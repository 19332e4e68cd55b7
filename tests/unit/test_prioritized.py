"""shared/replay/buffers/ring.py (PrioritizedBuffer, UniformBuffer) and
shared/replay/buffers/ratelimit.py (RateLimiter).

Statistical tests use a fixed seed, so each outcome is deterministic; the thresholds say what
"follows the distribution" means. Frequencies are compared with Pearson's chi-square statistic
against the chi-square distribution's 0.999 quantile for k - 1 degrees of freedom (scipy is
not in the venv: the quantiles below were computed from the regularized incomplete gamma
function and agree with scipy.stats.chi2.ppf(0.999, df) to the digits shown). For the
prioritized buffer the test is conservative: its draws are stratified over the priority mass,
which makes the counts less variable than multinomial ones, so a biased sampler is caught and
a correct one passes with room to spare.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from rlfleet.shared.replay.buffers.base import ChunkInfo, SampleError
from rlfleet.shared.replay.buffers.ratelimit import RateLimiter
from rlfleet.shared.replay.buffers.ring import PrioritizedBuffer, UniformBuffer

CHI2_999 = {9: 27.877, 19: 43.820, 49: 85.351}  # chi2.ppf(0.999, df)


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    assert expected.min() >= 5, "too few draws for the chi-square approximation"
    return float(((counts - expected) ** 2 / expected).sum())


def chunk(chunk_id: str, length: int, version: int = 0) -> ChunkInfo:
    return ChunkInfo(chunk_id, length, version)


def prioritized(capacity: int, **kwargs) -> PrioritizedBuffer:
    return PrioritizedBuffer("replay", capacity, seed=kwargs.pop("seed", 0), **kwargs)


def leaves(buf: PrioritizedBuffer) -> np.ndarray:
    return buf.sum.tree[buf.sum.size:buf.sum.size + buf.capacity].copy()


def monitor_fields(buf) -> dict:
    m = buf.monitor
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name != "_window"}


# -- PrioritizedBuffer: what is drawn ---------------------------------------------------------

def fifty_distinct(alpha: float = 0.6) -> tuple[PrioritizedBuffer, np.ndarray]:
    """50 items (uid == slot) with priorities 1..50; returns the buffer and P(i)."""
    buf = prioritized(50, alpha=alpha, seed=1234)
    buf.insert([chunk("a", 50)], 0)
    priorities = np.arange(1, 51, dtype=np.float64)
    assert buf.update_priorities(np.arange(50), priorities) == 50
    scaled = (priorities + buf.eps) ** alpha
    return buf, scaled / scaled.sum()


def test_sampling_frequencies_follow_priorities_to_the_alpha():
    buf, probs = fifty_distinct()
    # P as the tree holds it agrees with the formula
    np.testing.assert_allclose(leaves(buf) / buf.sum.total, probs, rtol=1e-12)
    counts = np.zeros(50, dtype=np.int64)
    for i in range(100):  # 100 requests of 10 x 100 items: 100,000 draws
        refs = buf.sample(100, 10, train_iteration=i, policy_version=0)
        counts += np.bincount(refs.item_ids.ravel(), minlength=50)
    assert counts.sum() == 100_000
    assert chi_square(counts, probs) < CHI2_999[49]
    # and alpha matters: the same counts are far from uniform and from alpha = 1
    assert chi_square(counts, np.full(50, 1 / 50)) > 10 * CHI2_999[49]
    linear = np.arange(1, 51) / np.arange(1, 51).sum()
    assert chi_square(counts, linear) > 10 * CHI2_999[49]


@pytest.mark.parametrize("batch", [0, 19])
def test_every_batch_of_a_request_follows_the_priorities(batch: int):
    """Each batch of a multi-batch request is itself a draw from P, not one slice of the
    stratified priority mass (the first batch would then hold only the oldest slots)."""
    buf, probs = fifty_distinct()
    counts = np.zeros(50, dtype=np.int64)
    for i in range(2000):  # batch `batch` of 2000 requests of 20 x 50 items: 100,000 draws
        refs = buf.sample(50, 20, train_iteration=i, policy_version=0)
        counts += np.bincount(refs.item_ids[batch], minlength=50)
    assert chi_square(counts, probs) < CHI2_999[49]


def test_zero_priority_items_are_never_sampled_when_eps_is_zero():
    buf = prioritized(40, priority_eps=0.0)
    buf.insert([chunk("a", 30)], 0)  # 30 of 40 slots filled; the rest hold no mass
    priorities = np.where(np.arange(30) % 3 == 0, 0.0, np.arange(30) + 1.0)
    buf.update_priorities(np.arange(30), priorities)
    refs = [buf.sample(64, 8, 0, 0) for _ in range(50)]
    drawn = np.concatenate([r.item_ids.ravel() for r in refs])
    assert set(drawn.tolist()) == {i for i in range(30) if i % 3}
    # weights are normalised by the smallest priority that can be drawn, not by zero
    weights = np.concatenate([r.weights.ravel() for r in refs])
    assert np.isfinite(weights).all() and weights.max() == 1.0
    assert weights[drawn == 1].min() == 1.0


def test_sample_reports_chunks_rows_and_item_ids():
    buf = prioritized(100)
    buf.insert([chunk("a", 30, version=3), chunk("b", 50, version=5)], train_iteration=7)
    refs = buf.sample(16, 4, train_iteration=10, policy_version=6)
    assert refs.rows.shape == refs.item_ids.shape == refs.chunk_index.shape == (4, 16)
    names = np.array(refs.chunk_ids)[refs.chunk_index]
    uid = refs.item_ids
    np.testing.assert_array_equal(names, np.where(uid < 30, "a", "b"))
    np.testing.assert_array_equal(refs.rows, np.where(uid < 30, uid, uid - 30))
    assert buf.monitor.sampled_items == 64
    assert buf.monitor.staleness_sum == 64 * 3
    assert buf.use_counts().sum() == 64


# -- PrioritizedBuffer: importance weights ----------------------------------------------------

@pytest.mark.parametrize("train_iteration,beta", [
    (0, 0.4), (250, 0.55), (500, 0.7), (1000, 1.0), (50_000, 1.0)])
def test_importance_weights_follow_the_formula_with_annealed_beta(train_iteration, beta):
    buf = prioritized(200, alpha=0.7, beta=0.4, beta_final=1.0, beta_anneal_iterations=1000,
                      seed=5)
    buf.insert([chunk("a", 100), chunk("b", 50)], 0)  # N = 150 of 200 slots
    rng = np.random.default_rng(9)
    priorities = rng.uniform(0.01, 20.0, size=150)
    buf.update_priorities(np.arange(150), priorities)
    assert buf.beta(train_iteration) == pytest.approx(beta)

    refs = buf.sample(32, 4, train_iteration=train_iteration, policy_version=0)
    n = len(buf)
    p_all = buf.sum.get(np.arange(n)) / buf.sum.total  # P from the tree
    np.testing.assert_allclose(p_all, (priorities + buf.eps) ** 0.7
                               / ((priorities + buf.eps) ** 0.7).sum(), rtol=1e-12)
    max_weight = ((n * p_all) ** -beta).max()
    expected = (n * p_all[refs.item_ids]) ** -beta / max_weight
    assert refs.weights is not None and refs.weights.dtype == np.float32
    np.testing.assert_allclose(refs.weights, expected, rtol=1e-6)
    assert (refs.weights <= 1.0).all()


def test_weight_normaliser_tracks_the_smallest_priority_after_updates():
    buf = prioritized(10, beta=0.5, beta_final=0.5)
    buf.insert([chunk("a", 10)], 0)
    buf.update_priorities(np.arange(10), np.arange(1, 11, dtype=np.float64))
    buf.update_priorities(np.array([0]), np.array([100.0]))  # the old minimum goes away
    refs = buf.sample(1000, 1, 0, 0)
    p = buf.sum.get(np.arange(10)) / buf.sum.total
    assert buf.min.min == pytest.approx((2.0 + buf.eps) ** 0.6)
    slot1 = refs.item_ids == 1  # now the smallest priority: weight exactly 1
    assert slot1.any() and np.allclose(refs.weights[slot1], 1.0)
    np.testing.assert_allclose(refs.weights, (p[refs.item_ids] / p.min()) ** -0.5, rtol=1e-6)


# -- PrioritizedBuffer: priorities ------------------------------------------------------------

def test_new_items_get_the_largest_priority_seen_so_far():
    buf = prioritized(100, alpha=0.6)
    buf.insert([chunk("a", 10)], 0)
    np.testing.assert_array_equal(leaves(buf)[:10], 1.0)  # nothing seen yet: priority 1
    buf.update_priorities(np.arange(10), np.linspace(0.5, 4.0, 10))
    assert buf.max_priority == 4.0 + buf.eps
    buf.insert([chunk("b", 10)], 0)
    np.testing.assert_allclose(leaves(buf)[10:20], (4.0 + buf.eps) ** 0.6, rtol=1e-15)
    buf.update_priorities(np.arange(20), np.full(20, 0.1))  # lower everything
    buf.insert([chunk("c", 10)], 0)
    np.testing.assert_allclose(leaves(buf)[20:30], (4.0 + buf.eps) ** 0.6, rtol=1e-15)
    assert buf.min.min == pytest.approx((0.1 + buf.eps) ** 0.6)


def test_stale_priority_updates_are_ignored_and_counted():
    buf = prioritized(20)
    buf.insert([chunk("a", 20)], 0)
    old = int(buf.sample(4, 1, 0, 0).item_ids[0, 0])
    buf.insert([chunk("b", 20)], 0)  # every slot refilled, including old's
    before, max_before = leaves(buf), buf.max_priority
    assert buf.update_priorities(np.array([old]), np.array([100.0])) == 0
    np.testing.assert_array_equal(leaves(buf), before)
    assert buf.max_priority == max_before
    assert buf.monitor.stale_priority_updates == 1 and buf.monitor.priority_updates == 0

    # a live id in the same slot is applied; never-issued and negative ids are stale too
    live = old + 20
    ids = np.array([old, live, buf.next_uid + 3, -1])
    assert buf.update_priorities(ids, np.array([100.0, 3.0, 7.0, 7.0])) == 1
    expected = before.copy()
    expected[live % 20] = (3.0 + buf.eps) ** 0.6
    np.testing.assert_array_equal(leaves(buf), expected)
    assert buf.monitor.stale_priority_updates == 4 and buf.monitor.priority_updates == 1


@pytest.mark.parametrize("ids,priorities,match", [
    ([0, 1, 2], [1.0, 2.0], "3 item ids but 2 priorities"),
    ([0, 1], [1.0, -0.5], "finite and non-negative"),
    ([0, 1], [1.0, np.nan], "finite and non-negative"),
    ([0, 1], [np.inf, 1.0], "finite and non-negative"),
])
def test_invalid_priority_updates_raise_and_change_nothing(ids, priorities, match):
    buf = prioritized(10)
    buf.insert([chunk("a", 10)], 0)
    before, mins, monitor = leaves(buf), buf.min.tree.copy(), monitor_fields(buf)
    with pytest.raises(ValueError, match=match):
        buf.update_priorities(np.array(ids), np.array(priorities))
    np.testing.assert_array_equal(leaves(buf), before)
    np.testing.assert_array_equal(buf.min.tree, mins)
    assert monitor_fields(buf) == monitor and buf.max_priority == 1.0


def test_duplicate_ids_in_one_update_last_wins():
    buf = prioritized(10, alpha=1.0, priority_eps=0.0)
    buf.insert([chunk("a", 10)], 0)
    buf.update_priorities(np.array([3, 3, 3]), np.array([5.0, 9.0, 2.0]))
    assert leaves(buf)[3] == 2.0 and buf.sum.total == 11.0


# -- ring bookkeeping: released chunks --------------------------------------------------------

def test_released_chunks_are_exactly_those_fully_overwritten():
    buf = prioritized(10)
    assert buf.insert([chunk("a", 4), chunk("b", 4)], 0) == []
    assert buf.insert([chunk("c", 4)], 0) == []  # overwrites half of a
    assert buf.insert([chunk("d", 2)], 0) == ["a"]  # the rest of a
    assert buf.insert([chunk("e", 5)], 0) == ["b"]  # all of b, one item of c
    assert buf.chunk_ids() == {"c", "d", "e"}
    assert sorted(buf.insert([chunk("f", 25)], 0)) == ["c", "d", "e"]  # f's newest 10 fit
    assert buf.chunk_ids() == {"f"}
    np.testing.assert_array_equal(np.sort(buf.row), np.arange(15, 25))
    assert buf.insert([chunk("f", 3)], 0) == []  # a retried report is ignored
    assert buf.monitor.released_chunks == 5


@pytest.mark.parametrize("kind", ["prioritized", "uniform"])
def test_released_chunks_match_a_model_of_the_ring(kind: str):
    capacity = 37
    buf = prioritized(capacity) if kind == "prioritized" else UniformBuffer("u", capacity, 0)
    rng = np.random.default_rng(11)
    owner: list[str | None] = [None] * capacity  # the model: which chunk each slot holds
    next_uid, released_total = 0, 0
    for step in range(400):
        infos = [chunk(f"c{step}-{j}", int(rng.integers(1, 50))) for j in
                 range(int(rng.integers(1, 4)))]
        live_before = {c for c in owner if c is not None}
        for info in infos:
            uids = np.arange(next_uid, next_uid + info.length)[-capacity:]
            for u in uids.tolist():
                owner[u % capacity] = info.chunk_id
            next_uid += info.length
        live_after = {c for c in owner if c is not None}
        released = buf.insert(infos, step)
        assert len(released) == len(set(released))
        # released: chunks that were live, or came in this call, and have no item left
        assert set(released) == (live_before | {i.chunk_id for i in infos}) - live_after
        assert buf.chunk_ids() == live_after
        released_total += len(released)
        if kind == "prioritized" and step % 7 == 0:
            ids = rng.integers(max(0, next_uid - 2 * capacity), next_uid, size=10)
            buf.update_priorities(ids, rng.random(10))
    assert buf.monitor.released_chunks == released_total
    assert buf.next_uid == next_uid


# -- snapshots --------------------------------------------------------------------------------

def busy_buffer() -> PrioritizedBuffer:
    buf = prioritized(64, alpha=0.6, beta=0.4, beta_anneal_iterations=100, seed=2)
    rng = np.random.default_rng(4)
    for step in range(30):
        buf.insert([chunk(f"c{step}", int(rng.integers(1, 20)), version=step // 3)], step)
        refs = buf.sample(8, 2, train_iteration=step, policy_version=step // 3 + 1)
        buf.update_priorities(refs.item_ids, rng.random(refs.item_ids.shape) * 5)
        buf.update_priorities(np.array([max(0, buf.next_uid - 100)]), np.array([1.0]))
    buf.monitor.dropped["too_old"] += 3
    return buf


def test_snapshot_restore_round_trips_exactly_through_safetensors(tmp_path):
    buf = busy_buffer()
    arrays, meta = buf.snapshot()
    assert all(isinstance(v, str) for v in meta.values())
    path = tmp_path / "buffer.safetensors"
    save_file(arrays, str(path), metadata=meta)
    with safe_open(str(path), framework="np") as f:
        loaded = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
        loaded_meta = f.metadata()

    back = prioritized(64, alpha=0.6, beta=0.4, beta_anneal_iterations=100, seed=99)
    back.restore(loaded, loaded_meta)
    for key in ("uid", "chunk", "row", "inserted_at", "version", "uses"):
        np.testing.assert_array_equal(getattr(back, key), getattr(buf, key), err_msg=key)
        assert getattr(back, key).dtype == getattr(buf, key).dtype
    np.testing.assert_array_equal(back.sum.tree, buf.sum.tree)
    np.testing.assert_array_equal(back.min.tree, buf.min.tree)
    assert back.max_priority == buf.max_priority
    assert back.train_iteration == buf.train_iteration
    assert back.next_uid == buf.next_uid
    assert back.table.index == buf.table.index
    assert back.table.ids == buf.table.ids[:len(back.table.ids)]
    assert back.table.refs == buf.table.refs[:len(back.table.refs)]
    assert back.chunk_ids() == buf.chunk_ids()
    assert monitor_fields(back) == monitor_fields(buf)
    assert back.stats() == buf.stats() | {"inserts_per_s": 0.0, "samples_per_s": 0.0}

    # and both carry on alike: same releases, same applied updates, same weights
    for step in range(30, 40):
        infos = [chunk(f"c{step}", 11)]
        assert back.insert(infos, step) == buf.insert(infos, step)
        ids = np.arange(buf.next_uid - 30, buf.next_uid)
        prio = np.linspace(0.1, 3, 30)
        assert back.update_priorities(ids, prio) == buf.update_priorities(ids, prio)
    np.testing.assert_array_equal(back.sum.tree, buf.sum.tree)
    assert back.beta(back.train_iteration) == buf.beta(buf.train_iteration)
    # the generator's state travels too: the next draws are the same
    a, b = back.sample(16, 4, 40, 5), buf.sample(16, 4, 40, 5)
    np.testing.assert_array_equal(a.item_ids, b.item_ids)
    np.testing.assert_array_equal(a.weights, b.weights)


def test_restore_refuses_another_kind_or_capacity():
    arrays, meta = busy_buffer().snapshot()
    with pytest.raises(ValueError, match="cannot restore"):
        prioritized(65).restore(arrays, meta)
    with pytest.raises(ValueError, match="cannot restore"):
        UniformBuffer("replay", 64, 0).restore(arrays, meta)


# -- UniformBuffer ----------------------------------------------------------------------------

def test_uniform_sample_range_returns_only_the_newest_items():
    buf = UniformBuffer("u", 100, seed=3, sample_range=30)
    buf.insert([chunk("a", 90), chunk("b", 70)], 0)  # 160 items through 100 slots
    ids = np.concatenate([buf.sample(64, 4, 0, 0).item_ids.ravel() for _ in range(20)])
    assert set(ids.tolist()) == set(range(130, 160))
    small = UniformBuffer("u", 100, seed=3, sample_range=30)
    small.insert([chunk("a", 12)], 0)  # fewer items than the range: all of them
    ids = small.sample(100, 1, 0, 0).item_ids
    assert set(ids.ravel().tolist()) == set(range(12))


def test_uniform_without_replacement_never_repeats_within_a_request():
    buf = UniformBuffer("u", 100, seed=4, replacement=False)
    buf.insert([chunk("a", 150)], 0)  # the newest 100 fit
    for _ in range(200):
        ids = buf.sample(10, 7, 0, 0).item_ids.ravel()
        assert len(set(ids.tolist())) == 70
        assert ids.min() >= 50
    everything = buf.sample(25, 4, 0, 0).item_ids.ravel()
    assert sorted(everything.tolist()) == list(range(50, 150))
    with pytest.raises(SampleError, match="fewer than the 101"):
        buf.sample(101, 1, 0, 0)

    ranged = UniformBuffer("u", 100, seed=4, replacement=False, sample_range=20)
    ranged.insert([chunk("a", 60)], 0)
    assert sorted(ranged.sample(5, 4, 0, 0).item_ids.ravel().tolist()) == list(range(40, 60))
    with pytest.raises(SampleError, match="20 items in range, fewer than the 21"):
        ranged.sample(7, 3, 0, 0)


def test_uniform_frequencies_are_uniform():
    buf = UniformBuffer("u", 50, seed=7)
    buf.insert([chunk("a", 80)], 0)  # wrapped: ids 30..79
    counts = np.zeros(50, dtype=np.int64)
    for i in range(50):  # 50 requests of 32 x 64 items: 102,400 draws
        counts += np.bincount(buf.sample(64, 32, i, 0).item_ids.ravel() - 30, minlength=50)
    assert counts.sum() == 50 * 64 * 32
    assert chi_square(counts, np.full(50, 1 / 50)) < CHI2_999[49]


def test_empty_and_bad_requests_raise_sample_errors():
    for buf in (UniformBuffer("u", 10, 0), prioritized(10)):
        with pytest.raises(SampleError, match="empty"):
            buf.sample(1, 1, 0, 0)
        buf.insert([chunk("a", 3)], 0)
        with pytest.raises(SampleError, match="at least 1"):
            buf.sample(0, 1, 0, 0)
        with pytest.raises(SampleError, match="at least 1"):
            buf.sample(4, 0, 0, 0)


# -- RateLimiter ------------------------------------------------------------------------------

def test_min_size_gates_sampling():
    limiter = RateLimiter(min_size=100)
    assert limiter.grantable_batches(32, size=99, inserted=99, sampled=0) == 0
    assert limiter.grantable_batches(32, size=100, inserted=100, sampled=0) == 1 << 30
    # the buffer's size (after evictions) gates too, not only what was ever inserted
    assert limiter.grantable_batches(32, size=50, inserted=500, sampled=0) == 0
    assert not limiter.inserts_blocked(inserted=99, sampled=0)
    assert RateLimiter(min_size=0).grantable_batches(8, size=0, inserted=0, sampled=0) == 0


def test_no_ratio_means_free():
    limiter = RateLimiter(min_size=1, samples_per_insert=None, error_buffer=1.0)
    assert limiter.grantable_batches(256, size=10, inserted=10, sampled=10**9) == 1 << 30
    assert not limiter.inserts_blocked(inserted=10**9, sampled=0)


def test_grantable_batches_follow_the_ratio_and_the_error_buffer():
    limiter = RateLimiter(min_size=100, samples_per_insert=2.0, error_buffer=64)
    assert limiter.target(100) == 0.0 and limiter.target(150) == 100.0
    # right at min_size: only the error buffer's worth
    assert limiter.grantable_batches(32, size=100, inserted=100, sampled=0) == 2
    assert limiter.grantable_batches(32, size=100, inserted=100, sampled=1) == 1
    # 50 more inserts: 100 more samples allowed; room = 100 + 64 - sampled
    assert limiter.grantable_batches(32, size=150, inserted=150, sampled=0) == 5
    assert limiter.grantable_batches(32, size=150, inserted=150, sampled=100) == 2
    assert limiter.grantable_batches(32, size=150, inserted=150, sampled=133) == 0
    assert limiter.grantable_batches(32, size=150, inserted=150, sampled=500) == 0
    assert limiter.grantable_batches(1, size=150, inserted=150, sampled=163) == 1


def test_inserts_block_when_samplers_fall_behind():
    limiter = RateLimiter(min_size=100, samples_per_insert=2.0, error_buffer=64)
    # target(200) = 200: blocked below 136 sampled items
    assert limiter.inserts_blocked(inserted=200, sampled=135)
    assert not limiter.inserts_blocked(inserted=200, sampled=136)
    assert not limiter.inserts_blocked(inserted=132, sampled=0)  # target 64: still in band
    assert limiter.inserts_blocked(inserted=133, sampled=0)


def test_a_lopsided_band_keeps_the_learner_at_its_top():
    """min_lead: collectors wait while samplers are less than min_lead items ahead of the
    line, as a single process that trains between chunks always is; sampling is bounded by
    error_buffer as without it."""
    limiter = RateLimiter(min_size=100, samples_per_insert=2.0, error_buffer=64, min_lead=32)
    # target(200) = 200: inserts wait below 232 sampled items, sampling stops at 264
    assert limiter.inserts_blocked(inserted=200, sampled=231)
    assert not limiter.inserts_blocked(inserted=200, sampled=232)
    assert limiter.grantable_batches(16, size=200, inserted=200, sampled=232) == 2
    # at min_size nothing was sampled yet: the learner goes first, as in one process
    assert limiter.inserts_blocked(inserted=100, sampled=0)
    assert not limiter.inserts_blocked(inserted=99, sampled=0)
    # a negative lead is a lower edge behind the line; None is the symmetric band
    assert not RateLimiter(min_size=100, samples_per_insert=2.0, error_buffer=64,
                           min_lead=-10).inserts_blocked(inserted=200, sampled=190)
    assert RateLimiter(min_size=100, samples_per_insert=2.0, error_buffer=64,
                       min_lead=None).inserts_blocked(inserted=200, sampled=135)


@pytest.mark.parametrize("min_lead", [None, -40.0, 0.0, 32.0])
def test_someone_can_always_move_in_a_lopsided_band(min_lead):
    """Liveness with min_lead up to error_buffer - one batch (what the config allows)."""
    batch = 32
    limiter = RateLimiter(min_size=50, samples_per_insert=1.0, error_buffer=64,
                          min_lead=min_lead)
    for inserted in range(50, 400, 7):
        for sampled in range(0, 500, 3):
            blocked = limiter.inserts_blocked(inserted, sampled)
            grant = limiter.grantable_batches(batch, inserted, inserted, sampled)
            assert not (blocked and grant == 0), (inserted, sampled)


@pytest.mark.parametrize("spi", [0.25, 1.0, 3.0])
def test_someone_can_always_move_when_the_band_fits_a_batch(spi: float):
    """Liveness: with error_buffer >= batch/2, whenever collectors are blocked a learner can
    take at least one batch, and whenever a learner gets nothing collectors may insert."""
    batch = 32
    limiter = RateLimiter(min_size=50, samples_per_insert=spi, error_buffer=batch / 2)
    for inserted in range(50, 400, 7):
        for sampled in range(0, int(spi * 400) + 64, 3):
            blocked = limiter.inserts_blocked(inserted, sampled)
            grant = limiter.grantable_batches(batch, inserted, inserted, sampled)
            assert not (blocked and grant == 0), (inserted, sampled)


@pytest.mark.parametrize("spi,error_buffer", [(4.0, 512.0), (0.5, 64.0)])
def test_limiter_holds_the_band_with_concurrent_learners_and_collectors(spi, error_buffer):
    """Two learner and three collector threads share one buffer under one condition
    variable, as the coordinator's request handlers do. After every step (checked under the
    lock) sampled items stay within [target - error_buffer - one chunk's worth, target +
    error_buffer]: a collector that was let in has its whole chunk accepted. Every wait has a
    timeout and the whole run a deadline, so a deadlock fails the test instead of hanging."""
    limiter = RateLimiter(min_size=200, samples_per_insert=spi, error_buffer=error_buffer)
    buf = UniformBuffer("u", 5000, seed=0)
    cond = threading.Condition(buf.lock)
    chunk_len, chunks_each, batch, max_batches = 50, 150, 32, 4
    collectors_left = [3]
    errors: list[str] = []
    waits = {"learner": 0, "collector": 0}
    deadline = time.monotonic() + 30.0

    def check(who: str) -> None:
        inserted, sampled = buf.monitor.inserted_items, buf.monitor.sampled_items
        line = limiter.target(inserted)
        if sampled > line + error_buffer:
            errors.append(f"{who}: sampled {sampled} above {line} + {error_buffer}")
        if sampled < line - error_buffer - spi * chunk_len:
            errors.append(f"{who}: sampled {sampled} below {line} - {error_buffer} - chunk")

    def collector(k: int) -> None:
        try:
            for j in range(chunks_each):
                with cond:
                    while limiter.inserts_blocked(buf.monitor.inserted_items,
                                                  buf.monitor.sampled_items):
                        if time.monotonic() > deadline:
                            errors.append(f"collector {k} stuck")
                            return
                        waits["collector"] += 1
                        cond.wait(timeout=0.05)
                    buf.insert([chunk(f"{k}-{j}", chunk_len)], 0)
                    check(f"collector {k}")
                    cond.notify_all()
                time.sleep(0.0001)  # stepping environments
        finally:
            with cond:
                collectors_left[0] -= 1
                cond.notify_all()

    def learner(k: int) -> None:
        while True:
            with cond:
                m = buf.monitor
                grant = limiter.grantable_batches(batch, len(buf), m.inserted_items,
                                                  m.sampled_items)
                if grant == 0:
                    if collectors_left[0] == 0:
                        return
                    if time.monotonic() > deadline:
                        errors.append(f"learner {k} stuck")
                        return
                    waits["learner"] += 1
                    cond.wait(timeout=0.05)
                    continue
                buf.sample(batch, min(grant, max_batches), 0, 0)
                check(f"learner {k}")
                cond.notify_all()
            time.sleep(0.0002)  # training on the batch

    threads = ([threading.Thread(target=learner, args=(k,), daemon=True) for k in range(2)]
               + [threading.Thread(target=collector, args=(k,), daemon=True) for k in range(3)])
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.1, deadline - time.monotonic()))
    assert not [t for t in threads if t.is_alive()], "threads still running: a deadlock"
    assert errors == []
    inserted, sampled = buf.monitor.inserted_items, buf.monitor.sampled_items
    assert inserted == 3 * chunks_each * chunk_len
    # the learners drained what the final inserts allowed, to within one batch
    assert limiter.target(inserted) + error_buffer - batch < sampled
    assert sampled <= limiter.target(inserted) + error_buffer
    # both sides were held back: learners at least until min_size; with 4 samples per insert
    # collectors outrun the learners and wait for them
    assert waits["learner"] > 0, waits
    if spi > 1:
        assert waits["collector"] > 0, waits
