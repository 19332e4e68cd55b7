"""A data process for the learner: sample requests, chunk reads, decoding and batch assembly
in a process of its own (`dataproc_child.py`), ready batches in shared memory; this module is
the learner's handle on it.

With a small network an update takes about a millisecond, and a prefetch thread in the same
process (JSON, decoding, fancy-indexing) holds the GIL just when the training thread comes
back from a torch call, so the learner falls well short of the update rate of the same loop
fed from memory (bench/RESULTS.md). Here the training thread is alone with its GIL. As in
Sample Factory, the batches never cross a pipe: the data process writes each answer's batches
into one of a few shared-memory slots and sends a one-line JSON message naming the slot and
the layout; the learner maps the slot once and wraps the rows in torch tensors without a
copy. It hands a slot back when it asks for the next batches, so the data process can run at
most `depth` answers ahead.

The data process also stores the policy versions the learner publishes (`weight_sink`,
`learner/output/weight_relay.py`), which takes their encoding and writing off the training
process's GIL.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.learner.feed.dataproc_child import STATE_KEYS
from rlfleet.learner.feed.shm import SHM_DIR
from rlfleet.learner.output.publisher import RelaySink, WeightSink
from rlfleet.learner.output.weight_relay import RelayClient, RelayUnavailable, WeightRegion
from rlfleet.shared.batching.transforms import BatchTransforms
from rlfleet.shared.contract.wire.sampling import MixShare
from rlfleet.shared.infra.storage import Storage

log = logging.getLogger("rlfleet.learner")


class DataProcessError(RuntimeError):
    """The data process exited, or could not start."""


class DataProcess:
    """The learner's handle on its data process, a `Feed`: `get()` the next answer's
    batches, flags and counters mirrored from the data process (the same as
    `Prefetcher`'s)."""

    def __init__(self, coordinator_url: str, storage_url: str, run: str, worker_id: str,
                 batch_size: int, batches_per_request: int, depth: int, cache_size: int,
                 mix: list[MixShare] | None = None, group_generation: int | None = None,
                 cursor: int = 0, start_timeout_s: float = 60.0,
                 transforms: BatchTransforms | None = None) -> None:
        """`transforms`: what the data process does to sampled rows (n-step returns, HER,
        per-buffer rewards); it makes its own from their settings."""
        import torch  # noqa: F401  (the learner's side only)

        self.settings = {"coordinator": coordinator_url, "storage": storage_url, "run": run,
                         "worker_id": worker_id, "batch_size": batch_size,
                         "batches_per_request": batches_per_request, "depth": depth,
                         "cache_size": cache_size,
                         "mix": [m.model_dump() for m in mix] if mix else None,
                         "group_generation": group_generation, "cursor": cursor,
                         "transforms": (transforms.settings()
                                        if transforms is not None and transforms.active
                                        else None)}
        self.start_timeout_s = start_timeout_s
        self.stop_run = threading.Event()
        self.group_ended = threading.Event()
        self.broken: str | None = None
        self.rate_limited = 0
        self.dropped_responses = 0
        self.sample_wait_s = 0.0
        self.fetch_s = 0.0
        self.cursor = cursor
        self.seen_generation: int | None = None
        self.exited: str | None = None
        self.ready: queue.Queue[dict] = queue.Queue()
        # algo.obs_norm: the counts of the chunks the data process read, not yet taken
        self._moments: list[dict] = []
        self._moments_lock = threading.Lock()
        self._maps: dict[str, mmap.mmap] = {}
        self._held: int | None = None
        self._started = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._stdin_lock = threading.Lock()  # the training and the publish thread write
        self.relay: RelayClient | None = None
        self._ended: str | None = None

    def start(self) -> DataProcess:
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.learner.feed.dataproc_child"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1, env=env, cwd=root)
        self._send(self.settings)
        self.relay = RelayClient(WeightRegion(SHM_DIR, f"rlfleet-dp-{self._proc.pid}-w-"),
                                 self._send, lambda: self._ended)
        self._reader = threading.Thread(target=self._read, name="data-inbox", daemon=True)
        self._reader.start()
        if not self._started.wait(self.start_timeout_s):
            self.close()
            raise DataProcessError(f"the data process sent nothing in "
                                   f"{self.start_timeout_s:g} s")
        if self.exited:
            raise DataProcessError(self.exited)
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("data process: not a message: %r", line[:200])
                continue
            if message["kind"] == "published":
                assert self.relay is not None
                self.relay.reply(message)
                continue
            self._mirror(message["state"])
            if message["kind"] == "batches":
                with self._moments_lock:
                    self._moments.extend(message.get("moments") or [])
                self.ready.put(message)
            self._started.set()
        code = self._proc.wait()
        self._ended = f"the data process has exited (code {code})"
        if code != 0:
            self.exited = f"the data process exited with code {code}"
            log.warning("%s", self.exited)
        self._started.set()

    def _mirror(self, state: dict[str, Any]) -> None:
        for key in STATE_KEYS:
            setattr(self, key, state[key])
        if state["stop_run"]:
            self.stop_run.set()
        if state["group_ended"]:
            self.group_ended.set()

    def take_moments(self) -> list[dict]:
        """The observation counts of the chunks read since the last call (`SampleLoop`'s)."""
        with self._moments_lock:
            out, self._moments = self._moments, []
        return out

    def get(self, timeout: float) -> list | None:
        """The next answer's batches; the slot of the last ones goes back to the data
        process (their tensors must not be used after this call)."""
        self._hand_back()
        if self.exited and self.ready.empty():
            raise DataProcessError(self.exited)
        try:
            message = self.ready.get(timeout=timeout)
        except queue.Empty:
            return None
        self._held = message["slot"]
        return self._batches(message)

    def _batches(self, message: dict) -> list:
        import torch

        from rlfleet.shared.batching.batching import Batch

        path = message["path"]
        region = self._maps.get(path)
        if region is None:
            with open(path, "r+b") as f:
                region = mmap.mmap(f.fileno(), 0)
            os.unlink(path)  # mapped: the name is no longer needed, nothing can leak
            self._maps = {p: m for p, m in self._maps.items()
                          if not Path(p).name.startswith(_slot_prefix(path))}
            self._maps[path] = region

        def tensor(name: str) -> torch.Tensor:
            offset, dtype, shape = message["layout"][name]
            count = int(np.prod(shape, dtype=np.int64))
            arr = np.frombuffer(region, dtype=np.dtype(dtype), count=count, offset=offset)
            return torch.from_numpy(arr.reshape(shape))

        fields = [f for f in message["layout"] if f not in ("weights", "item_ids")]
        data = {f: tensor(f) for f in fields}
        weights = tensor("weights") if "weights" in message["layout"] else None
        ids = tensor("item_ids").numpy() if "item_ids" in message["layout"] else None
        out = []
        for b in range(message["num_batches"]):
            refs = [(buffer, ids[b, start:start + n].copy(), slice(start, start + n))
                    for buffer, start, n in message["refs"]] if ids is not None else []
            # views, not copies: only a logged update copies them (learner/observe/batch_log.py)
            samples = [(buffer, ids[b, start:start + n], slice(start, start + n))
                       for buffer, start, n in message.get("spans", [])] \
                if ids is not None else []
            out.append(Batch({f: t[b] for f, t in data.items()},
                             None if weights is None else weights[b], refs,
                             samples=samples))
        return out

    def _hand_back(self) -> None:
        if self._held is None or self._proc is None or self._proc.stdin is None:
            return
        held, self._held = self._held, None
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self._send({"free": held})  # if it fails, the data process exited: `get` says so

    def _send(self, message: dict) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        with self._stdin_lock:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()

    def put(self, version: int, state: Mapping[str, Any],
            metadata: Mapping[str, str]) -> None:
        """Store a policy version through the data process
        (`learner/output/weight_relay.py`)."""
        if self.relay is None:
            raise RelayUnavailable("the data process has not started")
        self.relay.put(version, state, metadata)

    def weight_sink(self, storage: Storage) -> WeightSink:
        """This process's relay writes the versions; storage what it cannot take."""
        return RelaySink(self, storage)

    def close(self, wait: bool = True) -> None:
        """End the data process (it ends its loop when its stdin closes); `wait=False`
        leaves the waiting and the clean-up to a thread."""
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(BrokenPipeError, OSError, ValueError), self._stdin_lock:
            assert proc.stdin is not None
            proc.stdin.close()  # the data process ends its loop
        if not wait:
            threading.Thread(target=self._reap, name="data-reap", daemon=True).start()
            return
        self._reap()

    def _reap(self) -> None:
        proc = self._proc
        assert proc is not None
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self.relay is not None:
            self.relay.close()
        for region in self._maps.values():
            with contextlib.suppress(BufferError):  # tensors still viewing it: GC frees it
                region.close()
        self._maps.clear()
        for path in SHM_DIR.glob(f"rlfleet-dp-{proc.pid}-*"):  # killed before we mapped
            path.unlink(missing_ok=True)


def _slot_prefix(path: str) -> str:
    """`rlfleet-dp-<pid>-<slot>-`: the names of one slot's regions, of every size."""
    name = Path(path).name
    return name[:name.rfind("-") + 1]
