"""Turning sample references into training batches with as few numpy calls as possible.

One sample response names U chunks and B batches. The chunks' columns are concatenated once
(U * chunk_size rows), then each field of every batch is a single fancy-index: no Python loop
over items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from learner.dqn import BATCH_FIELDS


def assemble(chunks: Sequence[Mapping[str, np.ndarray]], chunk_index: np.ndarray,
             rows: np.ndarray, fields: Sequence[str] = BATCH_FIELDS
             ) -> list[dict[str, torch.Tensor]]:
    """`chunks[k]` is the decoded chunk `chunk_index == k` points at; returns one dict of
    tensors per batch (row of `chunk_index`)."""
    lengths = np.fromiter((len(c["reward"]) for c in chunks), dtype=np.int64, count=len(chunks))
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    flat = offsets[chunk_index] + rows  # (num_batches, batch_size) into the concatenation
    columns = {f: np.concatenate([c[f] for c in chunks]) for f in fields}
    picked = {f: torch.from_numpy(col[flat]) for f, col in columns.items()}
    return [{f: t[b] for f, t in picked.items()} for b in range(flat.shape[0])]
