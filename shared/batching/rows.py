"""The rows of a sample answer: which fields a batch carries, and where each sampled item's
rows are in its chunks' concatenated columns. The learner's sampler, the data process and
the single-process runner read batches through these; they import no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.shared.algos.base import RECURRENT_PREFIX
from rlfleet.shared.contract.frames import FRAMES

DEFAULT_FIELDS = ("obs", "action", "reward", "next_obs", "terminated")
# Games with illegal moves add the legal actions at obs and next_obs (DQN's targets use them).
MASK_FIELDS = ("action_mask", "next_action_mask")


def batch_fields(columns: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """The fields an off-policy batch carries: the usual ones, and the masks where the
    chunks have them. Chunks of a recurrent policy (act extras named `recurrent_*`) add
    `cut` and those columns (sorted): a recurrent learner needs the state the collector
    acted from at each row, and where each run ends."""
    fields = DEFAULT_FIELDS + tuple(f for f in MASK_FIELDS if f in columns)
    recurrent = sorted(f for f in columns if f.startswith(RECURRENT_PREFIX))
    if recurrent:
        fields += tuple(f for f in ("cut", *recurrent) if f not in fields)
    return fields


def column_rows(columns: Mapping[str, np.ndarray]) -> int:
    """Rows of the concatenated (or arena) columns: the length of any column but frames."""
    return next((len(a) for f, a in columns.items() if f != FRAMES), 0)


def part_rows(part: Any, offsets: np.ndarray, total_rows: int,
              cut: np.ndarray | None = None) -> np.ndarray:
    """Flat row indices of a sample part's items into its chunks' concatenated columns
    (chunk k's rows start at `offsets[k]`; `total_rows` rows in all): (B, n), or (B, n, L)
    for sequence parts.

    A padded sequence (a `sequence` buffer's, whose segment ends before L rows) runs past
    its run's last row, which is a cut row, and maybe past the last row of the columns: its
    rows after the first cut are the learner's to mask. Indices stay in bounds (clamped to
    the last row), and where `cut` (the columns' cut flags) is given, every row after a
    sequence's first cut repeats that cut row, so padding is that run's own data (finite,
    never another chunk's rows or an arena slot's unwritten ones) and still reads as past
    the cut. Sequences that stay inside one run (every episode buffer's) are unchanged."""
    flat = offsets[np.asarray(part.chunk_index, dtype=np.int64)] + np.asarray(part.rows,
                                                                              dtype=np.int64)
    if part.sequence_length:
        flat = flat[..., None] + np.arange(part.sequence_length)
        np.minimum(flat, max(total_rows - 1, 0), out=flat)
        if cut is not None and part.sequence_length > 1 and flat.size:
            cuts = np.asarray(cut, dtype=bool)[flat[..., :-1]]
            after = np.logical_or.accumulate(cuts, axis=-1)  # a cut at or before step t
            if after.any():
                first = np.argmax(cuts, axis=-1)[..., None]  # the first cut's step
                end = np.take_along_axis(flat, first, axis=-1)
                flat[..., 1:] = np.where(after, end, flat[..., 1:])
    return flat
