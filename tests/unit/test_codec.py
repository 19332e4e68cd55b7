"""shared/contract/codec.py: chunks and weights survive a round trip; foreign bytes raise
CodecError."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlfleet.shared.contract.codec import (
    CodecError,
    decode_arrays,
    decode_weights,
    encode_arrays,
    encode_weights,
    read_metadata,
)

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
          "float16", "float32", "float64"]
SHAPES = [(), (0,), (1,), (7,), (0, 4), (3, 4), (2, 3, 5), (1, 1, 1)]


def _array(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 100, size=shape)
    if dtype == "bool":
        return np.asarray(values % 2 == 0)
    if dtype.startswith("float"):
        return np.asarray(values / 7 - 3).astype(dtype)
    return np.asarray(values).astype(dtype)


# -- chunks -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_array_round_trip_keeps_dtype_shape_and_values(dtype, shape):
    arr = _array(dtype, shape)
    arrays, meta = decode_arrays(encode_arrays({"x": arr}))
    out = arrays["x"]
    assert out.dtype == arr.dtype
    assert out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)
    assert meta == {}


def test_chunk_with_every_field_and_metadata_round_trips():
    n = 37
    rng = np.random.default_rng(1)
    chunk = {
        "obs": rng.standard_normal((n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, n).astype(np.int64),
        "reward": np.ones(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
        "terminated": rng.random(n) < 0.1,
        "truncated": np.zeros(n, dtype=bool),
        "pixels": rng.integers(0, 256, (n, 2, 3, 3)).astype(np.uint8),
    }
    meta = {"policy_version": "12", "worker_id": "collector-1", "empty": "", "unicode": "é✓"}
    blob = encode_arrays(chunk, meta)
    assert isinstance(blob, bytes)
    arrays, got_meta = decode_arrays(blob)
    assert got_meta == meta
    assert read_metadata(blob) == meta
    assert set(arrays) == set(chunk)
    for name, arr in chunk.items():
        assert arrays[name].dtype == arr.dtype, name
        np.testing.assert_array_equal(arrays[name], arr, err_msg=name)


def test_zero_length_chunk_round_trips():
    chunk = {"obs": np.zeros((0, 4), np.float32), "reward": np.zeros(0, np.float32),
             "terminated": np.zeros(0, bool)}
    arrays, _ = decode_arrays(encode_arrays(chunk, {"policy_version": "-1"}))
    assert {k: v.shape for k, v in arrays.items()} == {"obs": (0, 4), "reward": (0,),
                                                        "terminated": (0,)}


def test_scalar_arrays_stay_zero_dimensional():
    arrays, _ = decode_arrays(encode_arrays({"f": np.array(2.5, np.float32),
                                             "b": np.array(True), "i": np.int64(7)}))
    assert arrays["f"].shape == () and arrays["f"] == np.float32(2.5)
    assert arrays["b"].shape == () and bool(arrays["b"]) is True
    assert arrays["i"].shape == () and arrays["i"] == 7


def test_non_contiguous_and_list_inputs_are_stored_by_value():
    base = np.arange(40, dtype=np.int32).reshape(5, 8)
    strided = base[::2, 1::3]
    fortran = np.asfortranarray(base)
    arrays, _ = decode_arrays(encode_arrays({"s": strided, "f": fortran, "l": [1.5, 2.5]}))
    np.testing.assert_array_equal(arrays["s"], strided)
    np.testing.assert_array_equal(arrays["f"], base)
    np.testing.assert_array_equal(arrays["l"], [1.5, 2.5])


def test_empty_mapping_round_trips():
    assert decode_arrays(encode_arrays({})) == ({}, {})
    assert decode_arrays(encode_arrays({}, {"k": "v"})) == ({}, {"k": "v"})


def test_decode_accepts_bytearray_and_memoryview():
    blob = encode_arrays({"x": np.arange(5)}, {"k": "v"})
    for view in (bytearray(blob), memoryview(blob)):
        arrays, meta = decode_arrays(view)
        np.testing.assert_array_equal(arrays["x"], np.arange(5))
        assert meta == {"k": "v"}


# -- weights ------------------------------------------------------------------------------

def test_weights_round_trip_a_torch_state_dict():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    state = net.state_dict()
    state["extra.step"] = torch.tensor(3, dtype=torch.int64)            # 0-d
    state["extra.empty"] = torch.zeros(0)
    state["extra.half"] = torch.ones(3, dtype=torch.bfloat16)
    state["extra.strided"] = torch.arange(12.0).reshape(3, 4).t()       # non-contiguous
    blob = encode_weights(state, {"policy_version": "7"})
    out, meta = decode_weights(blob)
    assert meta == {"policy_version": "7"}
    assert set(out) == set(state)
    for name, t in state.items():
        assert out[name].dtype == t.dtype, name
        assert out[name].shape == t.shape, name
        assert torch.equal(out[name], t), name
    copy = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    copy.load_state_dict({k: v for k, v in out.items() if not k.startswith("extra.")})
    x = torch.randn(5, 4)
    assert torch.equal(copy(x), net(x))


def test_weights_of_tensors_that_require_grad_encode():
    w = torch.randn(3, requires_grad=True)
    out, _ = decode_weights(encode_weights({"w": w}))
    assert torch.equal(out["w"], w.detach())
    assert not out["w"].requires_grad


# -- bad input ------------------------------------------------------------------------------

def _blob() -> bytes:
    return encode_arrays({"x": np.arange(10, dtype=np.int64)}, {"k": "v"})


def _with_header(header: object, data: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + data


BAD_BLOBS = {
    "empty": b"",
    "short": b"\x01\x02\x03",
    "garbage": b"this is certainly not safetensors at all",
    "zero header": (0).to_bytes(8, "little") + b"{}",
    "header longer than blob": (10**6).to_bytes(8, "little") + b"{}",
    "header not json": (5).to_bytes(8, "little") + b"abcde",
    "header not utf-8": (4).to_bytes(8, "little") + b"\xff\xfe\xfd\xfc",
    "header a list": _with_header([1, 2]),
    "truncated by one byte": _blob()[:-1],
    "truncated in the data": _blob()[:-40],
    "truncated in the header": _blob()[:20],
    "data shorter than header says": _with_header(
        {"x": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}}, b"\0" * 8),
    "unknown dtype": _with_header(
        {"x": {"dtype": "NOPE", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
    "shape disagrees with offsets": _with_header(
        {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
    "trailing garbage": _blob() + b"\0" * 13,
}


@pytest.mark.parametrize("decode", [decode_arrays, decode_weights],
                         ids=["decode_arrays", "decode_weights"])
@pytest.mark.parametrize("name", list(BAD_BLOBS))
def test_bad_bytes_raise_codec_error(decode, name):
    with pytest.raises(CodecError) as info:
        decode(BAD_BLOBS[name])
    message = str(info.value)
    assert message and "Traceback" not in message


@pytest.mark.parametrize("decode", [decode_arrays, decode_weights, read_metadata],
                         ids=["decode_arrays", "decode_weights", "read_metadata"])
@pytest.mark.parametrize("value", ["a string", None, 12, [1, 2], {"x": 1}],
                         ids=["str", "None", "int", "list", "dict"])
def test_non_bytes_raise_codec_error_naming_the_type(decode, value):
    with pytest.raises(CodecError, match=f"expected bytes, got {type(value).__name__}"):
        decode(value)


def test_error_messages_say_what_is_wrong():
    with pytest.raises(CodecError, match="0 bytes is too short"):
        decode_arrays(b"")
    with pytest.raises(CodecError, match="truncated"):
        decode_arrays(BAD_BLOBS["header longer than blob"])
    with pytest.raises(CodecError, match="not valid JSON"):
        decode_arrays(BAD_BLOBS["header not json"])
    with pytest.raises(CodecError, match="not a JSON object"):
        decode_arrays(BAD_BLOBS["header a list"])
    with pytest.raises(CodecError, match="corrupt"):
        decode_arrays(BAD_BLOBS["truncated by one byte"])


def test_codec_error_is_a_value_error():
    assert issubclass(CodecError, ValueError)


@pytest.mark.parametrize("arr", [np.array([object(), 1], dtype=object),
                                 np.array([1 + 2j, 3j]),
                                 np.array([1 + 2j], dtype=np.complex64),
                                 np.array(["a", "bc"]),
                                 np.arange(3, dtype=">i4")],
                         ids=["object", "complex128", "complex64", "str", "big-endian"])
def test_unsupported_dtype_names_the_array(arr):
    ok = np.zeros(3, np.float32)
    with pytest.raises(CodecError, match="'bad_field'") as info:
        encode_arrays({"fine": ok, "bad_field": arr})
    assert str(arr.dtype) in str(info.value)


def test_non_string_metadata_is_rejected_naming_the_key():
    with pytest.raises(CodecError, match="policy_version"):
        encode_arrays({"x": np.zeros(1)}, {"policy_version": 3})
    with pytest.raises(CodecError, match="policy_version"):
        encode_weights({"x": torch.zeros(1)}, {"policy_version": 3})
