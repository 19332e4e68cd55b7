"""Policy versions stored by the learner's data process: the training process copies a
version's tensors into shared memory, the data process encodes and stores them.

Encoding and storing a version costs about a millisecond of Python (safetensors, then a
Redis round trip or two file writes), tens of times a second. On the learner's publish
thread that millisecond would be taken from the training thread: both run under one GIL, and
a small network's update lets go of it at every torch call (bench/RESULTS.md has the
learner's share of its in-process ceiling with the publish thread writing and with the write
skipped). Through the relay, the learner's share of a version is a copy into a mapped region
and a line on a pipe.

The publisher keeps its rules (order, the newest state wins, backoff through an outage,
conflicts); the relay only moves where a write happens. When the data process cannot make a
write (it has exited, or a dtype has no numpy twin) the publisher makes it itself; a version
the data process stored just before it died is then found in storage, not taken for another
learner's.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import queue
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfleet.learner.feed.shm import new_region
from rlfleet.shared.contract.codec import encode_arrays
from rlfleet.shared.infra.storage import Storage, StorageError, VersionConflict

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rlfleet.learner")

Layout = dict[str, list]  # name -> [offset, numpy dtype str, shape]


class RelayUnavailable(RuntimeError):
    """The data process cannot store this version: store it in the learner instead."""


def _views(region: mmap.mmap, layout: Layout) -> dict[str, np.ndarray]:
    out = {}
    for name, (offset, dtype, shape) in layout.items():
        count = int(np.prod(shape, dtype=np.int64))
        out[name] = np.frombuffer(region, dtype=np.dtype(dtype), count=count,
                                  offset=offset).reshape(shape)
    return out


# -- the learner's side -------------------------------------------------------------------

class WeightRegion:
    """The learner's shared-memory region for one version's tensors, replaced by a bigger
    one under a new name when a state outgrows it. Its name is removed once the data
    process has mapped it, so a learner killed later leaves nothing in /dev/shm."""

    def __init__(self, directory: Path, prefix: str) -> None:
        self.directory = directory
        self.prefix = prefix
        self.path: Path | None = None
        self.map: mmap.mmap | None = None
        self.size = 0
        self.generation = 0

    def fill(self, state: Mapping[str, torch.Tensor]) -> Layout:
        """Copy `state` in and return its layout; `RelayUnavailable` for a dtype numpy
        has no twin of (bfloat16)."""
        if any(t.device.type != "cpu" for t in state.values()):
            return self._fill_from_device(state)
        arrays = {}
        for name, tensor in state.items():
            try:
                arrays[name] = tensor.detach().cpu().numpy()
            except TypeError as err:
                raise RelayUnavailable(f"tensor {name!r}: {err}") from err
        layout: Layout = {}
        size = 0
        for name, arr in arrays.items():
            size = (size + 63) // 64 * 64
            layout[name] = [size, arr.dtype.str, list(arr.shape)]
            size += arr.nbytes
        self._ensure(max(size, 1))
        assert self.map is not None
        views = _views(self.map, layout)
        for name, arr in arrays.items():
            np.copyto(views[name], arr)
        del views
        return layout

    def _fill_from_device(self, state: Mapping[str, torch.Tensor]) -> Layout:
        """A GPU learner's state: the tensors of each dtype side by side, gathered into one
        flat tensor on the device and copied to the region in one device-to-host copy (one
        for a network's fp32 weights), with no host copy in between."""
        import torch

        by_dtype: dict[torch.dtype, list[str]] = {}
        for name, tensor in state.items():
            by_dtype.setdefault(tensor.dtype, []).append(name)
        layout: Layout = {}
        blocks: list[tuple[int, np.dtype, list[str], int]] = []
        size = 0
        for dtype, names in by_dtype.items():
            try:
                np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            except TypeError as err:
                raise RelayUnavailable(f"dtype {dtype}: {err}") from err
            size = (size + 63) // 64 * 64
            start, count = size, 0
            for name in names:
                layout[name] = [start + count * np_dtype.itemsize, np_dtype.str,
                                list(state[name].shape)]
                count += state[name].numel()
            blocks.append((start, np_dtype, names, count))
            size = start + count * np_dtype.itemsize
        self._ensure(max(size, 1))
        assert self.map is not None
        for start, np_dtype, names, count in blocks:
            parts = [state[n].detach().reshape(-1) for n in names]
            gpu = next((p.device for p in parts if p.device.type != "cpu"), parts[0].device)
            flat = torch.cat([p.to(gpu) for p in parts]) if len(parts) > 1 else parts[0]
            view = np.frombuffer(self.map, dtype=np_dtype, count=count, offset=start)
            torch.from_numpy(view).copy_(flat)  # the one device-to-host copy
            del view
        return layout

    def _ensure(self, size: int) -> None:
        if self.map is not None and self.size >= size:
            return
        self.close()
        self.generation += 1
        self.path = self.directory / f"{self.prefix}{self.generation}"
        self.map = new_region(self.path, size)
        self.size = size

    def mapped(self) -> None:
        """The data process has the region mapped: its name is no longer needed."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def close(self) -> None:
        self.mapped()
        if self.map is not None:
            with contextlib.suppress(BufferError):
                self.map.close()
            self.map = None


class RelayClient:
    """The learner's end: `put` as `Storage.put_weights` would, one at a time.

    `send` writes one request line to the data process; `exited` says why it is gone (or
    None). Replies arrive through `reply`, called by the thread that reads its messages."""

    def __init__(self, region: WeightRegion, send: Callable[[dict], None],
                 exited: Callable[[], str | None]) -> None:
        self._region = region
        self._send = send
        self._exited = exited
        self._replies: queue.Queue[dict] = queue.Queue()
        self._lock = threading.Lock()

    def reply(self, message: dict) -> None:
        self._replies.put(message)

    def put(self, version: int, state: Mapping[str, torch.Tensor],
            metadata: Mapping[str, str]) -> None:
        """Store `version` (a `WeightSink`); raises `VersionConflict` and `StorageError` as
        storage does, and `RelayUnavailable` when the data process cannot."""
        with self._lock:
            gone = self._exited()
            if gone:
                raise RelayUnavailable(gone)
            layout = self._region.fill(state)
            try:
                self._send({"publish": version, "path": str(self._region.path),
                            "layout": layout, "meta": dict(metadata)})
            except (BrokenPipeError, OSError, ValueError) as err:
                raise RelayUnavailable(f"the data process takes no requests: {err}") from err
            while True:
                try:
                    reply = self._replies.get(timeout=0.5)
                except queue.Empty:
                    gone = self._exited()
                    if gone:
                        raise RelayUnavailable(gone) from None
                    continue
                if reply.get("version") == version:
                    break
            self._region.mapped()
        error, message = reply.get("error"), reply.get("message", "")
        if error == "conflict":
            raise VersionConflict(message)
        if error == "storage":
            raise StorageError(message)
        if error:
            raise RelayUnavailable(message)

    def close(self) -> None:
        with self._lock:  # not while a request is out
            self._region.close()


# -- the data process's side --------------------------------------------------------------

class WeightRelay:
    """The data process's publish thread: one request at a time, each answered with one
    `published` message. Requests queue behind a slow write; `end()` lets the last one
    finish, so a version handed over before the learner closed us is stored or refused,
    never dropped silently."""

    def __init__(self, storage: Storage, send: Callable[[dict], None]) -> None:
        self._storage = storage
        self._send = send
        self._requests: queue.Queue[dict | None] = queue.Queue()
        self._maps: dict[str, mmap.mmap] = {}
        self.stored = 0
        self._thread = threading.Thread(target=self._run, name="publish", daemon=True)
        self._thread.start()

    def submit(self, request: dict) -> None:
        self._requests.put(request)

    def end(self, timeout_s: float = 30.0) -> None:
        self._requests.put(None)
        self._thread.join(timeout_s)
        for region in self._maps.values():
            with contextlib.suppress(BufferError):
                region.close()
        self._maps.clear()

    def _run(self) -> None:
        while (request := self._requests.get()) is not None:
            try:
                reply = self._publish(request)
            except Exception as err:  # a bad request: the learner stores it itself
                log.exception("could not relay a policy version")
                reply = {"error": "relay", "message": f"{type(err).__name__}: {err}"}
            try:
                self._send({"kind": "published", "version": request.get("publish"), **reply})
            except (BrokenPipeError, OSError, ValueError):
                return  # the learner is gone

    def _publish(self, request: dict) -> dict[str, Any]:
        version, path = int(request["publish"]), str(request["path"])
        region = self._maps.get(path)
        if region is None:
            for old in self._maps.values():  # the learner grew its region
                with contextlib.suppress(BufferError):
                    old.close()
            with open(path, "r+b") as f:
                region = mmap.mmap(f.fileno(), 0)
            self._maps = {path: region}
        blob = encode_arrays(_views(region, request["layout"]), request["meta"])
        try:
            self._storage.put_weights(version, blob)
        except VersionConflict as err:
            return {"error": "conflict", "message": str(err)}
        except StorageError as err:
            return {"error": "storage", "message": str(err)}
        self.stored += 1
        return {"error": None}
