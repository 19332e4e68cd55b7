"""The one codec for everything in storage: safetensors, never pickle.

Experience chunks are columnar numpy arrays; policy weights are torch tensors. Both carry
string metadata in the safetensors header. A blob that is not safetensors raises `CodecError`
rather than anything deeper, because storage is shared and may hold foreign bytes.
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

_SUPPORTED = {np.dtype(t) for t in ("bool", "uint8", "int8", "int16", "int32", "int64",
                                    "uint16", "uint32", "uint64", "float16", "float32",
                                    "float64")}


class CodecError(ValueError):
    """Bytes that are not a valid rlfleet blob, or arrays that cannot be stored."""


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise CodecError(f"metadata values must be strings; bad keys: {bad}")
    return dict(metadata)


def encode_arrays(arrays: Mapping[str, np.ndarray],
                  metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise named numpy arrays (any shape, including empty) with string metadata."""
    out: dict[str, np.ndarray] = {}
    for name, arr in arrays.items():
        arr = np.asarray(arr)
        if arr.dtype not in _SUPPORTED:
            raise CodecError(f"array '{name}' has dtype {arr.dtype}, which safetensors cannot "
                             f"store; use one of {sorted(str(d) for d in _SUPPORTED)}")
        # np.require keeps a 0-d array 0-d; np.ascontiguousarray would make it shape (1,).
        out[name] = np.require(arr, requirements="C")
    return _np_save(out, metadata=_check_metadata(metadata))


def decode_arrays(blob: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Inverse of `encode_arrays`: (arrays, metadata)."""
    meta = read_metadata(blob)
    return _safe(_np_load, blob), meta


def encode_weights(state: Mapping[str, torch.Tensor],
                   metadata: Mapping[str, str] | None = None) -> bytes:
    """Tensors as safetensors; through numpy where every dtype has a numpy twin, the same
    format as `safetensors.torch.save` at a third of its cost (the learner encodes tens of
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
    """The header's string metadata, without touching the tensor data."""
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
