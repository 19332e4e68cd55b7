"""The buffer saver (`collector.save_to`): every whole episode a collector makes, also
written to a dataset directory, for `rlfleet export` to turn into a Minari dataset.

Chunks cut episodes anywhere (samples mode: env i owns rows i*T..i*T+T-1 of a chunk, and its
episode goes on in the next chunk), so the saver keeps each env's unfinished episode until
it ends, then writes it with its final observation. Each chunk that ends episodes gives one
file, written to a temporary name and renamed (a reader never sees half a file), as
safetensors: the episodes' steps concatenated, plus their lengths. An episode still running
when the collector stops is not written: a dataset holds whole episodes only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from rlfleet.shared.contract.codec import decode_arrays, encode_arrays

STEP_FIELDS = ("obs", "action", "reward", "terminated", "truncated")
SUFFIX = ".episodes.safetensors"


class EpisodeSaver:
    def __init__(self, directory: str | os.PathLike, worker_id: str, num_envs: int,
                 mode: str) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.worker_id = worker_id
        self.num_envs = num_envs
        self.mode = mode
        self.pending: dict[int, list[dict[str, np.ndarray]]] = {}  # env -> runs so far
        self.files = 0
        self.episodes_saved = 0
        # Files of an earlier life of this worker stay: number after them.
        self.seq = len(list(self.dir.glob(f"{worker_id}-*{SUFFIX}")))

    def add(self, arrays: Mapping[str, np.ndarray]) -> int:
        """Take one chunk (unpacked: whole observations); returns episodes written."""
        n = len(arrays["reward"])
        done = np.asarray(arrays["terminated"]) | np.asarray(arrays["truncated"])
        ends = np.flatnonzero(np.asarray(arrays["cut"]))
        finished: list[dict[str, np.ndarray]] = []
        start = 0
        for end in ends.tolist():
            run = run_rows(arrays, start, end)
            # samples mode: the env whose block this run lies in; episodes mode: runs are
            # whole episodes, never continued
            env = start * self.num_envs // n if self.mode == "samples" else -1
            parts = self.pending.pop(env, []) + [run]
            if done[end]:
                finished.append(as_episode(parts))
            else:
                self.pending[env] = parts
            start = end + 1
        if finished:
            self._write(finished)
        return len(finished)

    def _write(self, episodes: list[dict[str, np.ndarray]]) -> None:
        arrays = {k: np.concatenate([ep[k] for ep in episodes]) for k in episodes[0]}
        arrays["lengths"] = np.array([len(ep["actions"]) for ep in episodes], dtype=np.int64)
        path = self.dir / f"{self.worker_id}-{self.seq:08d}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(encode_arrays(arrays, {"worker_id": self.worker_id}))
        os.replace(tmp, path)
        self.seq += 1
        self.files += 1
        self.episodes_saved += len(episodes)

    def close(self) -> None:
        self.pending.clear()  # unfinished episodes are not whole: dropped


def run_rows(arrays: Mapping[str, np.ndarray], start: int, end: int) -> dict[str, np.ndarray]:
    """Rows start..end of a chunk, and the last row's next observation."""
    run = {k: np.asarray(arrays[k][start:end + 1]) for k in STEP_FIELDS}
    run["next_obs"] = np.asarray(arrays["next_obs"][end:end + 1])
    return run


def as_episode(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Runs of one episode as Minari's fields: n+1 observations, n of everything else."""
    obs = np.concatenate([p["obs"] for p in parts] + [parts[-1]["next_obs"]])
    return {"observations": obs,
            "actions": np.concatenate([p["action"] for p in parts]),
            "rewards": np.concatenate([p["reward"] for p in parts]),
            "terminations": np.concatenate([p["terminated"] for p in parts]),
            "truncations": np.concatenate([p["truncated"] for p in parts])}


def read_saved(directory: str | os.PathLike) -> Iterator[dict[str, np.ndarray]]:
    """The episodes a saver wrote, file by file in name order (per worker, in order)."""
    for path in sorted(Path(directory).glob(f"*{SUFFIX}")):
        arrays, _ = decode_arrays(path.read_bytes())
        lengths = arrays["lengths"].tolist()
        o = s = 0
        for n in lengths:
            yield {"observations": arrays["observations"][o:o + n + 1],
                   "actions": arrays["actions"][s:s + n], "rewards": arrays["rewards"][s:s + n],
                   "terminations": arrays["terminations"][s:s + n],
                   "truncations": arrays["truncations"][s:s + n]}
            o += n + 1
            s += n
