"""The binary form of a sample answer: its index arrays in one safetensors body.

A sample answer for 32 batches of 256 carries three arrays of 8,192 integers (and weights,
with a prioritized buffer). As JSON lists of lists, the coordinator would spend its time in
`tolist()` and encoding, and the learner's data process in parsing and validating 25k
numbers; as safetensors the arrays go as they are, both ways a memcpy. A client asks for it
with `Accept: application/x-rlfleet-sample+safetensors`; the scalar fields and each part's
name travel as JSON in the header's metadata. Everything else speaks JSON (and a client that
does not ask gets JSON).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlfleet.shared.contract.codec import CodecError, decode_arrays, encode_arrays
from rlfleet.shared.contract.wire.sampling import SamplePart, SampleResponse

MEDIA_TYPE = "application/x-rlfleet-sample+safetensors"
_ARRAYS = ("chunk_index", "rows", "item_ids", "weights", "lengths")


def encode_sample(fields: dict[str, Any], parts: Sequence[Any]) -> bytes:
    """`fields`: the answer's scalar fields and `chunk_ids`; `parts`: objects with the
    attributes of a `SamplePart`, numpy arrays (or None) for the index arrays."""
    arrays: dict[str, np.ndarray] = {}
    meta = []
    for i, part in enumerate(parts):
        meta.append({"buffer": part.buffer, "key": part.key,
                     "sequence_length": part.sequence_length})
        for name in _ARRAYS:
            value = getattr(part, name)
            if value is not None:
                arrays[f"{i}.{name}"] = np.asarray(value)
    return encode_arrays(arrays, {"sample": json.dumps({**fields, "parts": meta})})


def decode_sample(blob: bytes) -> SampleResponse:
    """A `SampleResponse` whose parts hold numpy arrays (built without validating every
    number: they come from our own coordinator, in a format that carries shapes and
    dtypes)."""
    arrays, meta = decode_arrays(blob)
    try:
        head = json.loads(meta["sample"])
        parts = []
        for i, p in enumerate(head.pop("parts")):
            # numpy arrays where the model declares lists: model_construct checks nothing
            columns: dict[str, Any] = {name: arrays.get(f"{i}.{name}") for name in _ARRAYS}
            parts.append(SamplePart.model_construct(**p, **columns))
        return SampleResponse.model_construct(**head, parts=parts)
    except (KeyError, TypeError, ValueError) as err:
        raise CodecError(f"not a sample answer: {err}") from None
