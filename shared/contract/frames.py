"""Each frame once: stacked image observations stored as frames plus indices.

An Atari transition's `obs` is a stack of 4 frames and its `next_obs` the same stack shifted
by one, so storing both costs 8 frames per step where 1 is new. Like Dopamine's and Reverb's
Atari pipelines, a chunk keeps each distinct frame once (`frames`, (F, *frame)) and every
row names the frames of its stacks (`obs_frames` and `next_obs_frames`, (N, S) int32); the
learner rebuilds a batch's stacks with one gather (`take`), never the whole chunk.

Packing is exact whatever the env: a frame is shared only where the bytes are equal, checked
here, so a wrong guess about an env's stacking costs space, never a wrong observation. What
makes sharing common is the chunk layout of `shared/rollout/rollout.py`: rows of one env are
contiguous, and within a run (no `cut` between them) row t's `obs` is row t-1's `next_obs`.
Across episode boundaries a stack padded with its reset frame repeats that frame, which is
shared too.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

FRAMES = "frames"
INDEX = {"obs": "obs_frames", "next_obs": "next_obs_frames"}
OBS_STACK = "obs_stack"  # a batch field: (rows, S+1, *frame), obs is [:, :S], next_obs [:, 1:]
_INDEX_DTYPE = np.int32


def packable(arrays: Mapping[str, np.ndarray]) -> bool:
    """Stacked uint8 images: (N, S, H, W[, C]) `obs` and `next_obs` of the same shape."""
    obs, nxt = arrays.get("obs"), arrays.get("next_obs")
    return (obs is not None and nxt is not None and obs.dtype == np.uint8
            and nxt.dtype == np.uint8 and obs.ndim >= 4 and obs.shape == nxt.shape
            and "cut" in arrays and FRAMES not in arrays)


def is_packed(arrays: Mapping[str, np.ndarray]) -> bool:
    return FRAMES in arrays


def _equal_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per leading index, whether all the rest is equal."""
    if a.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    return (a == b).reshape(a.shape[0], -1).all(axis=1)


def pack(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`arrays` with `obs` and `next_obs` replaced by `frames`, `obs_frames` and
    `next_obs_frames` (see `packable`); other columns are passed through."""
    obs, nxt, cut = arrays["obs"], arrays["next_obs"], np.asarray(arrays["cut"], dtype=bool)
    n, s = obs.shape[:2]
    # Row t continues row t-1 (same env, same episode) with the very same stack.
    follows = np.zeros(n, dtype=bool)
    if n > 1:
        candidates = np.flatnonzero(~cut[:-1]) + 1
        follows[candidates] = _equal_rows(obs[candidates], nxt[candidates - 1])
    # next_obs slot k is obs slot k+1 (the stack moved on by one frame).
    shifted = (nxt[:, :-1] == obs[:, 1:]).reshape(n, s - 1, -1).all(axis=2)
    # A fresh stack repeating a frame (padding at reset): slot k is slot k-1.
    fresh = np.flatnonzero(~follows)
    repeats = np.zeros((n, s - 1), dtype=bool)
    if fresh.size:
        repeats[fresh] = (obs[fresh, 1:] == obs[fresh, :-1]).reshape(fresh.size, s - 1,
                                                                      -1).all(axis=2)
    obs_idx = np.empty((n, s), dtype=_INDEX_DTYPE)
    next_idx = np.empty((n, s), dtype=_INDEX_DTYPE)
    # Where each new frame comes from: (0 = obs / 1 = next_obs, row, slot).
    src_kind: list[int] = []
    src_row: list[int] = []
    src_slot: list[int] = []

    def new(kind: int, row: int, slot: int) -> int:
        src_kind.append(kind)
        src_row.append(row)
        src_slot.append(slot)
        return len(src_kind) - 1

    follows_l, shifted_l, repeats_l = follows.tolist(), shifted.tolist(), repeats.tolist()
    for t in range(n):
        if follows_l[t]:
            obs_idx[t] = next_idx[t - 1]
        else:
            rep = repeats_l[t]
            prev = new(0, t, 0)
            obs_idx[t, 0] = prev
            for k in range(1, s):
                prev = prev if rep[k - 1] else new(0, t, k)
                obs_idx[t, k] = prev
        sh = shifted_l[t]
        for k in range(s - 1):
            next_idx[t, k] = obs_idx[t, k + 1] if sh[k] else new(1, t, k)
        next_idx[t, s - 1] = new(1, t, s - 1)

    kind = np.asarray(src_kind, dtype=np.int8)
    rows = np.asarray(src_row, dtype=np.int64)
    slots = np.asarray(src_slot, dtype=np.int64)
    frames = np.empty((len(src_kind), *obs.shape[2:]), dtype=np.uint8)
    for k, source in ((0, obs), (1, nxt)):
        sel = kind == k
        frames[sel] = source[rows[sel], slots[sel]]
    out = {key: value for key, value in arrays.items() if key not in INDEX}
    out[FRAMES] = frames
    out[INDEX["obs"]] = obs_idx
    out[INDEX["next_obs"]] = next_idx
    return out


def chunk_compression(setting: str, arrays: Mapping[str, np.ndarray]) -> str | None:
    """The codec for a chunk under `collector.compression`: `auto` compresses frames only
    (Atari frames shrink tens of times under zstd level 1 at GB/s; small float columns
    barely shrink and would cost every chunk the time)."""
    if setting == "auto":
        return "zstd" if is_packed(arrays) else None
    return None if setting == "none" else setting


def unpack(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The chunk as the rollout made it: full `obs` and `next_obs` (a no-op for a chunk that
    was not packed)."""
    if not is_packed(arrays):
        return dict(arrays)
    frames = arrays[FRAMES]
    out = {k: v for k, v in arrays.items() if k != FRAMES and k not in INDEX.values()}
    for name, index in INDEX.items():
        out[name] = frames[arrays[index]]
    return out


def field_layout(columns: Mapping[str, np.ndarray], name: str
                 ) -> tuple[np.dtype, tuple[int, ...]]:
    """dtype and per-row shape of a batch field, stored or rebuilt from frames."""
    if name in columns:
        col = columns[name]
        return col.dtype, tuple(col.shape[1:])
    frames, index = columns[FRAMES], columns[INDEX[name]]
    return frames.dtype, (index.shape[1], *frames.shape[1:])


def take(columns: Mapping[str, np.ndarray], name: str, rows: np.ndarray,
         out: np.ndarray | None = None) -> np.ndarray:
    """`columns[name][rows]`, rebuilding `obs`/`next_obs` stacks from frames where the
    columns hold frames instead (the indices must already point into `columns[FRAMES]`)."""
    if name in columns:
        return np.take(columns[name], rows, axis=0, out=out)
    index = np.take(columns[INDEX[name]], rows, axis=0)
    return np.take(columns[FRAMES], index, axis=0, out=out)


def stack_index(columns: Mapping[str, np.ndarray], rows: np.ndarray) -> np.ndarray | None:
    """Where every row's `next_obs` is its `obs` moved on by one frame (what frame stacking
    makes, episode ends included), the indices (..., S+1) of each row's S obs frames and its
    next frame: one gather gives both stacks (S+1 frames a row rather than 2S). None where
    the columns hold no frames, or some row's stacks do not line up so."""
    if FRAMES not in columns or any(i not in columns for i in INDEX.values()):
        return None
    obs_idx = np.take(columns[INDEX["obs"]], rows, axis=0)
    next_idx = np.take(columns[INDEX["next_obs"]], rows, axis=0)
    if obs_idx.shape[-1] < 2 or not np.array_equal(next_idx[..., :-1], obs_idx[..., 1:]):
        return None
    return np.concatenate([obs_idx, next_idx[..., -1:]], axis=-1)
