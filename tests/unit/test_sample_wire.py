"""The binary sample answer: the same fields as the JSON one, from a real coordinator, and
only for a client that asks for it."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.shared.contract.codec import CodecError, encode_arrays
from rlfleet.shared.contract.sample_wire import MEDIA_TYPE, decode_sample, encode_sample
from rlfleet.shared.contract.wire.sampling import SampleResponse
from rlfleet.shared.infra.http import HttpClient
from rlfleet.shared.replay.replay import PartRefs

from .helpers import buffer_config, collector_and_learner, ok, report, write_chunk


def test_a_sample_answer_survives_the_round_trip():
    rng = np.random.default_rng(0)
    parts = [PartRefs("replay", None, rng.integers(0, 5, (4, 16)), rng.integers(0, 128, (4, 16)),
                      rng.integers(0, 10**9, (4, 16)), rng.random((4, 16)).astype(np.float32),
                      None, None),
             PartRefs("episodes", "seq", rng.integers(0, 5, (4, 2)), rng.integers(0, 9, (4, 2)),
                      rng.integers(0, 99, (4, 2)), None, 8, np.array([3, 4]))]
    fields = {"chunk_ids": ["a", "b"], "num_batches": 4, "env_steps": 9, "train_iterations": 3,
              "policy_version": 2, "stop": False, "group_generation": None, "first_seq": None}
    got = decode_sample(encode_sample(fields, parts))
    assert isinstance(got, SampleResponse)
    assert got.chunk_ids == ["a", "b"] and got.num_batches == 4 and got.policy_version == 2
    for want, part in zip(parts, got.parts, strict=True):
        assert (part.buffer, part.key, part.sequence_length) == (want.buffer, want.key,
                                                                 want.sequence_length)
        for name in ("chunk_index", "rows", "item_ids", "weights", "lengths"):
            a, b = getattr(want, name), getattr(part, name)
            assert (a is None and b is None) or np.array_equal(a, b), name


def test_foreign_bytes_are_a_codec_error():
    with pytest.raises(CodecError):
        decode_sample(b"not safetensors at all")
    with pytest.raises(CodecError, match="not a sample answer"):
        decode_sample(encode_arrays({"x": np.zeros(2)}, {"other": "thing"}))


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_the_coordinator_answers_in_the_form_asked_for(coordinator, task_sink, kind):
    extra = {"alpha": 0.6, "beta": 0.4} if kind == "prioritized" else {}
    c = coordinator(buffers={"replay": buffer_config(kind=kind, **extra)})
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    ok(report(c, col["worker_id"], collect["task_id"],
              [(write_chunk(c, 128), 128) for _ in range(3)]))
    body = {"worker_id": lrn["worker_id"], "batch_size": 16, "num_batches": 4}
    client = HttpClient(c.url, timeout_s=5, retries=0)
    try:
        binary = client.post("/api/v1/sample", body, SampleResponse,
                             accept=(MEDIA_TYPE, decode_sample))
        plain = client.post("/api/v1/sample", body, SampleResponse)
    finally:
        client.close()
    [bp], [pp] = binary.parts, plain.parts
    assert isinstance(bp.rows, np.ndarray) and isinstance(pp.rows, list)
    assert bp.rows.shape == np.shape(pp.rows) == (4, 16)
    assert bp.item_ids.dtype == np.int64
    assert (bp.weights is None) == (pp.weights is None) == (kind == "uniform")
    assert binary.num_batches == plain.num_batches == 4
    assert set(binary.chunk_ids) <= {*plain.chunk_ids, *binary.chunk_ids}
    assert binary.env_steps == plain.env_steps == 384
