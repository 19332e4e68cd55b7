"""The one codec for everything in storage: safetensors, never pickle.

Experience chunks are columnar numpy arrays; policy weights are torch tensors. Both carry
string metadata in the safetensors header. A blob that is not safetensors raises `CodecError`
rather than anything deeper, because storage is shared and may hold foreign bytes.

Large columns may be compressed (zstd or lz4): Atari frames shrink tens of times. A
compressed column stays inside the safetensors container, as a 1-D uint8 tensor of the codec's
bytes, and the header's metadata records under one reserved key how to restore it, so storage
never holds a foreign format, and decoding checks every length before trusting it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as _np_load
from safetensors.numpy import save as _np_save

if TYPE_CHECKING:  # torch loads with the first weights call; the coordinator never makes one
    import torch
    import zstandard

_SUPPORTED = {np.dtype(t) for t in ("bool", "uint8", "int8", "int16", "int32", "int64",
                                    "uint16", "uint32", "uint64", "float16", "float32",
                                    "float64")}


COMPRESSIONS = ("none", "zstd", "lz4")
# Where the compressed columns are described: {name: {"codec", "dtype", "shape"}} as JSON.
CODEC_KEY = "rlfleet.codec"
# Columns smaller than this stay raw: the codec's frame overhead and the call cost more than
# they save.
MIN_COMPRESSED_BYTES = 16 * 1024
# A column is kept compressed only if that saves at least this fraction.
MIN_SAVING = 0.1


class CodecError(ValueError):
    """Bytes that are not a valid rlfleet blob, or arrays that cannot be stored."""


class _Codecs:
    """The compressors, imported on first use: a process that never compresses never loads
    them. Both write a checksum of the content: without one, flipped bits decompress to a
    wrong frame of the right length, which no length check could catch."""

    _zstd_c: dict[int, zstandard.ZstdCompressor] = {}
    _zstd_d: zstandard.ZstdDecompressor | None = None

    @classmethod
    def compress(cls, codec: str, data: bytes | memoryview, level: int | None) -> bytes:
        if codec == "zstd":
            import zstandard

            lvl = 1 if level is None else level
            if lvl not in cls._zstd_c:
                cls._zstd_c[lvl] = zstandard.ZstdCompressor(
                    level=lvl, write_content_size=True, write_checksum=True)
            return cls._zstd_c[lvl].compress(data)
        import lz4.frame

        return lz4.frame.compress(data, compression_level=0 if level is None else level,
                                  store_size=True, content_checksum=True)

    @classmethod
    def decompress(cls, codec: str, data: bytes, size: int) -> bytes:
        if codec == "zstd":
            import zstandard

            if cls._zstd_d is None:
                cls._zstd_d = zstandard.ZstdDecompressor()
            try:
                return cls._zstd_d.decompress(data, max_output_size=size)
            except zstandard.ZstdError as err:
                raise ValueError(str(err)) from None
        import lz4.frame

        try:
            return lz4.frame.decompress(data)
        except RuntimeError as err:
            raise ValueError(str(err)) from None


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise CodecError(f"metadata values must be strings; bad keys: {bad}")
    return dict(metadata)


def encode_arrays(arrays: Mapping[str, np.ndarray],
                  metadata: Mapping[str, str] | None = None,
                  compression: str | None = None, level: int | None = None) -> bytes:
    """Serialise named numpy arrays (any shape, including empty) with string metadata;
    with `compression` ("zstd" or "lz4"), columns of at least `MIN_COMPRESSED_BYTES` that
    shrink by `MIN_SAVING` or more are stored compressed."""
    if compression not in (None, *COMPRESSIONS):
        raise CodecError(f"compression={compression!r}: expected one of {COMPRESSIONS}")
    meta = _check_metadata(metadata)
    if meta is not None and CODEC_KEY in meta:
        raise CodecError(f"metadata key {CODEC_KEY!r} is reserved for the codec")
    out: dict[str, np.ndarray] = {}
    record: dict[str, dict] = {}
    for name, arr in arrays.items():
        arr = np.asarray(arr)
        if arr.dtype not in _SUPPORTED:
            raise CodecError(f"array '{name}' has dtype {arr.dtype}, which safetensors cannot "
                             f"store; use one of {sorted(str(d) for d in _SUPPORTED)}")
        # np.require keeps a 0-d array 0-d; np.ascontiguousarray would make it shape (1,).
        arr = np.require(arr, requirements="C")
        if compression in ("zstd", "lz4") and arr.nbytes >= MIN_COMPRESSED_BYTES:
            packed = _Codecs.compress(compression, arr.data.cast("B"), level)
            if len(packed) <= (1 - MIN_SAVING) * arr.nbytes:
                record[name] = {"codec": compression, "dtype": arr.dtype.str,
                                "shape": list(arr.shape)}
                arr = np.frombuffer(packed, dtype=np.uint8)
        out[name] = arr
    if record:
        meta = {**(meta or {}), CODEC_KEY: json.dumps(record)}
    return _np_save(out, metadata=meta)


def decode_arrays(blob: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Inverse of `encode_arrays`: (arrays, metadata)."""
    header_meta = _raw_metadata(blob)
    arrays = _safe(_np_load, blob)
    raw = header_meta.pop(CODEC_KEY, None)
    if raw is not None:
        _restore(arrays, raw)
    return arrays, header_meta


def _restore(arrays: dict[str, np.ndarray], raw: str) -> None:
    """Decompress the columns the codec record names, in place, checking every length."""
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as err:
        raise CodecError(f"the {CODEC_KEY} record is not valid JSON: {err}") from None
    if not isinstance(record, dict):
        raise CodecError(f"the {CODEC_KEY} record is not a JSON object")
    for name, spec in record.items():
        col = arrays.get(name)
        if col is None or col.dtype != np.uint8 or col.ndim != 1:
            raise CodecError(f"column '{name}' is recorded as compressed but is not a 1-D "
                             "uint8 tensor in the blob")
        try:
            codec, dtype = spec["codec"], np.dtype(spec["dtype"])
            shape = tuple(int(d) for d in spec["shape"])
        except (KeyError, TypeError, ValueError) as err:
            raise CodecError(f"column '{name}': bad codec record {spec!r}: {err}") from None
        if codec not in ("zstd", "lz4"):
            raise CodecError(f"column '{name}': unknown codec {codec!r}")
        if dtype not in _SUPPORTED or any(d < 0 for d in shape):
            raise CodecError(f"column '{name}': bad dtype or shape in {spec!r}")
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        try:
            data = _Codecs.decompress(codec, col.tobytes(), size)
        except ValueError as err:
            raise CodecError(f"column '{name}': corrupt {codec} data: {err}") from None
        if len(data) != size:
            raise CodecError(f"column '{name}': {codec} data holds {len(data)} bytes, the "
                             f"record says {size}")
        # writable, like the arrays safetensors loads (bytes would make it read-only)
        arrays[name] = np.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def encode_weights(state: Mapping[str, torch.Tensor],
                   metadata: Mapping[str, str] | None = None) -> bytes:
    """Tensors as safetensors; through numpy where every dtype has a numpy twin, the same
    format as `safetensors.torch.save` at a fraction of its cost (the learner encodes tens of
    versions a second)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    try:
        arrays = {k: t.numpy() for k, t in tensors.items()}
    except TypeError:  # bfloat16 and the like
        arrays = None
    if arrays is not None and all(a.dtype in _SUPPORTED for a in arrays.values()):
        return encode_arrays(arrays, metadata)
    from safetensors.torch import save as _torch_save

    return _torch_save(tensors, metadata=_check_metadata(metadata))


def decode_weights(blob: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors.torch import load as _torch_load

    meta = read_metadata(blob)
    return _safe(_torch_load, blob), meta


def read_metadata(blob: bytes) -> dict[str, str]:
    """The header's string metadata, without touching the tensor data (the codec's own
    record is not the caller's)."""
    meta = _raw_metadata(blob)
    meta.pop(CODEC_KEY, None)
    return meta


def _raw_metadata(blob: bytes) -> dict[str, str]:
    header = _header(blob)
    meta = header.get("__metadata__", {})
    return dict(meta) if isinstance(meta, dict) else {}


def _header(blob: bytes) -> dict:
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(blob).__name__}")
    if len(blob) < 8:
        raise CodecError(f"blob of {len(blob)} bytes is too short to be safetensors")
    n = int.from_bytes(bytes(blob[:8]), "little")
    if n <= 0 or 8 + n > len(blob):
        raise CodecError(f"blob declares a {n}-byte header but holds {len(blob)} bytes: "
                         "not safetensors, or truncated")
    try:
        header = json.loads(bytes(blob[8:8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CodecError(f"safetensors header is not valid JSON: {err}") from None
    if not isinstance(header, dict):
        raise CodecError("safetensors header is not a JSON object")
    return header


def _safe(loader, blob: bytes):
    try:
        return loader(bytes(blob))
    except (SafetensorError, ValueError, TypeError) as err:
        raise CodecError(f"corrupt safetensors blob: {err}") from None
