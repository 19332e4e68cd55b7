"""Compressed chunk columns: still safetensors, round-trip exactly, and corrupt bytes raise
`CodecError` rather than anything else or a wrong array."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from rlfleet.shared.contract.codec import (
    CODEC_KEY,
    CodecError,
    decode_arrays,
    encode_arrays,
    read_metadata,
)

CODECS = ["zstd", "lz4"]


def _frames(n: int = 300) -> np.ndarray:
    """Smooth images with a little noise: compressible like game screens."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:84, 0:84]
    base = ((x + y) % 64).astype(np.uint8)
    frames = np.repeat(base[None], n, axis=0)
    frames[:, 40:44, 10:14] = rng.integers(0, 255, (n, 4, 4), dtype=np.uint8)
    return frames


def _chunk() -> dict[str, np.ndarray]:
    n = 300
    return {"frames": _frames(n), "reward": np.linspace(-1, 1, n, dtype=np.float32),
            "action": np.arange(n, dtype=np.int64) % 6, "terminated": np.zeros(n, bool),
            "empty": np.zeros((0, 3), np.float32), "scalar": np.array(7, dtype=np.int32)}


def _record(blob: bytes) -> dict:
    n = int.from_bytes(blob[:8], "little")
    meta = json.loads(blob[8:8 + n]).get("__metadata__", {})
    return json.loads(meta.get(CODEC_KEY, "{}"))


def _payload_span(blob: bytes, name: str) -> tuple[int, int]:
    n = int.from_bytes(blob[:8], "little")
    start, end = json.loads(blob[8:8 + n])[name]["data_offsets"]
    return 8 + n + start, 8 + n + end


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_is_exact_and_smaller(codec):
    chunk = _chunk()
    meta = {"policy_version": "3", "worker_id": "c-1"}
    plain = encode_arrays(chunk, meta)
    blob = encode_arrays(chunk, meta, compression=codec)
    assert len(blob) < len(plain) / 5
    st_load(blob)  # still a safetensors container
    arrays, got_meta = decode_arrays(blob)
    assert got_meta == meta
    assert set(arrays) == set(chunk)
    for name, arr in chunk.items():
        assert arrays[name].dtype == arr.dtype and arrays[name].shape == arr.shape
        np.testing.assert_array_equal(arrays[name], arr)
    assert arrays["frames"].flags.writeable
    assert set(_record(blob)) == {"frames"}  # the small columns stay raw
    assert read_metadata(blob) == meta


@pytest.mark.parametrize("codec", CODECS)
def test_incompressible_columns_stay_raw(codec):
    noise = np.random.default_rng(1).integers(0, 256, (50, 84, 84), dtype=np.uint8)
    blob = encode_arrays({"frames": noise}, compression=codec)
    assert _record(blob) == {}
    np.testing.assert_array_equal(decode_arrays(blob)[0]["frames"], noise)


def test_no_compression_writes_what_it_always_wrote():
    chunk = _chunk()
    assert encode_arrays(chunk, {"a": "b"}) == st_save(
        {k: np.require(v, requirements="C") for k, v in chunk.items()}, metadata={"a": "b"})
    assert encode_arrays(chunk, compression="none") == encode_arrays(chunk)


@pytest.mark.parametrize("codec", CODECS)
def test_corrupt_compressed_bytes_raise(codec):
    blob = bytearray(encode_arrays(_chunk(), compression=codec))
    start, end = _payload_span(bytes(blob), "frames")
    mid = (start + end) // 2
    blob[mid:mid + 16] = bytes(255 - b for b in blob[mid:mid + 16])
    with pytest.raises(CodecError, match="frames"):
        decode_arrays(bytes(blob))


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_blobs_raise(codec):
    blob = encode_arrays(_chunk(), compression=codec)
    for cut in (4, 100, len(blob) // 2, len(blob) - 1):
        with pytest.raises(CodecError):
            decode_arrays(blob[:cut])


@pytest.mark.parametrize("record, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"frames": {"codec": "brotli", "dtype": "|u1", "shape": [2, 2]}}),
     "unknown codec"),
    (json.dumps({"frames": {"codec": "zstd", "dtype": "|u1", "shape": [9, 84, 84]}}),
     "frames"),
    (json.dumps({"missing": {"codec": "zstd", "dtype": "|u1", "shape": [1]}}), "missing"),
    (json.dumps({"frames": {"codec": "zstd"}}), "bad codec record"),
])
def test_a_bad_codec_record_raises(record, message):
    good = encode_arrays(_chunk(), compression="zstd")
    arrays = st_load(good)
    blob = st_save(arrays, metadata={CODEC_KEY: record})
    with pytest.raises(CodecError, match=message):
        decode_arrays(blob)


def test_the_reserved_key_and_unknown_codecs_are_refused():
    with pytest.raises(CodecError, match="reserved"):
        encode_arrays(_chunk(), {CODEC_KEY: "{}"})
    with pytest.raises(CodecError, match="compression"):
        encode_arrays(_chunk(), compression="gzip")
