"""Turning sample references into training batches with as few numpy calls as possible.

One sample response names U chunks and B batches drawn from one or more buffers (parts).
The chunks' columns are concatenated once (U x chunk rows), then each field of every part is
a single fancy-index: no Python loop over items. Sequence parts index (B, n, L) rows at once.
A run's `BatchTransforms` (`shared/batching/transforms.py`: n-step returns, hindsight relabelling,
per-buffer rewards) compute their fields on the way, just as vectorised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlfleet.shared.batching.rows import DEFAULT_FIELDS, column_rows, part_rows
from rlfleet.shared.batching.transforms import BatchTransforms
from rlfleet.shared.contract.frames import take, unpack


@dataclass
class Batch:
    """Tensors for one update, plus what is needed to send priorities back: for each
    prioritized part, (buffer, item ids, the slice of this batch it occupies). `samples`
    names every part's items the same way, prioritized or not, for the batch log."""

    data: dict[str, torch.Tensor]
    weights: torch.Tensor | None = None
    item_refs: list[tuple[str, np.ndarray, slice]] = field(default_factory=list)
    key: str | None = None
    samples: list[tuple[str, np.ndarray, slice]] = field(default_factory=list)

    def __len__(self) -> int:
        return int(next(iter(self.data.values())).shape[0])


def _columns(chunks: Sequence[Mapping[str, np.ndarray]], fields: Sequence[str]
             ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    chunks = [unpack(c) for c in chunks]  # a no-op for chunks without frames
    lengths = np.fromiter((len(c["reward"]) for c in chunks), dtype=np.int64, count=len(chunks))
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(chunks) else lengths
    return {f: np.concatenate([c[f] for c in chunks]) for f in fields}, offsets


def assemble(chunks: Sequence[Mapping[str, np.ndarray]], parts: Sequence[Any],
             num_batches: int, fields: Sequence[str] = DEFAULT_FIELDS,
             by_key: bool = False, transforms: BatchTransforms | None = None
             ) -> list[Batch] | list[dict[str, Batch]]:
    """`chunks[k]` is the decoded chunk that index k of the response names.

    Mix mode (`by_key=False`): batch b is the concatenation of every part's batch b.
    Dict mode: batch b is {part.key: that part's batch b}.
    """
    stored = (fields if transforms is None or not transforms.active
              else list(dict.fromkeys(transforms.columns_needed(fields))))
    columns, offsets = _columns(chunks, stored)
    return assemble_from(columns, offsets, parts, num_batches, fields, by_key, transforms)


def assemble_from(columns: Mapping[str, np.ndarray], offsets: np.ndarray, parts: Sequence[Any],
                  num_batches: int, fields: Sequence[str] = DEFAULT_FIELDS,
                  by_key: bool = False, transforms: BatchTransforms | None = None
                  ) -> list[Batch] | list[dict[str, Batch]]:
    """As `assemble`, with chunk k's rows starting at `columns[f][offsets[k]]` (the layout a
    `ChunkArena` keeps, so no chunk is copied per request)."""
    if transforms is not None:
        fields = transforms.fields(fields)
    per_part = []
    total_rows, cut = column_rows(columns), columns.get("cut")
    for part in parts:
        flat = part_rows(part, offsets, total_rows, cut)
        if transforms is None:
            arrays = {f: take(columns, f, flat) for f in fields}
        else:
            arrays = transforms.gather(columns, flat, fields, part.buffer)
        data = {f: torch.from_numpy(a) for f, a in arrays.items()}
        weights = (None if part.weights is None
                   else torch.as_tensor(np.asarray(part.weights, dtype=np.float32)))
        per_part.append((part, data, weights, np.asarray(part.item_ids, dtype=np.int64)))

    if by_key:
        out_dict: list[dict[str, Batch]] = []
        for b in range(num_batches):
            batches = {}
            for part, data, weights, ids in per_part:
                n = ids.shape[1]
                here = [(part.buffer, ids[b], slice(0, n))]
                batches[part.key] = Batch({f: t[b] for f, t in data.items()},
                                          None if weights is None else weights[b],
                                          here if weights is not None else [], part.key, here)
            out_dict.append(batches)
        return out_dict

    if len(per_part) == 1:
        part, data, weights, ids = per_part[0]
        n = ids.shape[1]
        out_one: list[Batch] = []
        for b in range(num_batches):
            here = [(part.buffer, ids[b], slice(0, n))]
            out_one.append(Batch({f: t[b] for f, t in data.items()},
                                 None if weights is None else weights[b],
                                 here if weights is not None else [], samples=here))
        return out_one

    merged = {f: torch.cat([d[f] for _, d, _, _ in per_part], dim=1) for f in fields}
    any_weights = any(w is not None for _, _, w, _ in per_part)
    weights_all = None
    if any_weights:
        weights_all = torch.cat([w if w is not None else torch.ones(ids.shape, dtype=torch.float32)
                                 for _, _, w, ids in per_part], dim=1)
    out: list[Batch] = []
    for b in range(num_batches):
        refs, samples, start = [], [], 0
        for part, _, w, ids in per_part:
            n = ids.shape[1]
            samples.append((part.buffer, ids[b], slice(start, start + n)))
            if w is not None:
                refs.append(samples[-1])
            start += n
        out.append(Batch({f: t[b] for f, t in merged.items()},
                         None if weights_all is None else weights_all[b], refs,
                         samples=samples))
    return out
