"""Batches onto the learner's device, one ahead of the update that needs them.

Batches arrive in shared memory from the learner's data process (`learner/feed/dataproc.py`). On
a CPU learner they are used where they lie. On a GPU learner, as in Sample Factory's and
torch's DataLoader's `pin_memory`, each batch is copied into a page-locked (pinned) host
buffer, then to a device buffer by a non-blocking copy on a side stream; the training loop
stages batch k+1 right after it has queued update k, so the copy runs while the GPU computes
and the next update finds its batch on the device. Two slots of buffers take turns: a slot's
host buffer is refilled only once its last copy is done, and its device buffer only once the
update that read it is done (CUDA events; the CPU never waits for the GPU otherwise).

Atari frames cross the bus once, as uint8: the data process sends each row's S+1 distinct
frames (`obs_stack`) instead of an S-frame `obs` and an S-frame `next_obs` that share S-1 of
them, and `expand_stacks` turns the device copy into both as views; the network scales them
to floats on the device (`NatureCNN`).

`GpuClock` times the GPU itself with events: busy from the start of an update to its end,
waiting from the end of one to the start of the next (for a copy, or because the loop had
no batch). Its figures are the learner's `gpu_wait_fraction` and `gpu_busy_fraction`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlfleet.shared.contract.frames import FRAMES, INDEX, OBS_STACK


def expand_stacks(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`obs` and `next_obs` as views of `obs_stack`, where a batch carries one (in place)."""
    stack = data.pop(OBS_STACK, None)
    if stack is not None:
        data["obs"] = stack[:, :-1]
        data["next_obs"] = stack[:, 1:]
    return data


def expand_frames(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`obs` and `next_obs` gathered from a packed rollout's frames (each distinct frame
    once, `learner/feed/rollouts.py`), where it is: on a GPU learner, on the device (in place)."""
    frames = data.pop(FRAMES, None)
    if frames is not None:
        for name, index in INDEX.items():
            data[name] = frames[data.pop(index).long()]
    return data


@dataclass(slots=True)
class Staged:
    """A batch on its way to the device: `data` may be used once `Stager.ready` said so."""

    data: dict[str, torch.Tensor]
    slot: int | None = None  # None: already usable (a CPU learner, or a blocking copy)


class Stager:
    """Moves batches to `device`: as they are on the CPU; through pinned double buffers on
    a side stream for CUDA with `pin`; by plain blocking copies for CUDA without it.
    `copies` forces the double-buffered path's bookkeeping on any device (tests run it on
    the CPU, pinning off)."""

    def __init__(self, device: torch.device, pin: bool = True, slots: int = 2,
                 copies: bool | None = None) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.copies = self.cuda if copies is None else copies
        self.pin = pin and self.cuda
        self.slots = slots
        self.stream = torch.cuda.Stream(device) if self.pin else None
        self._host: list[dict[str, torch.Tensor]] = [{} for _ in range(slots)]
        self._dev: list[dict[str, torch.Tensor]] = [{} for _ in range(slots)]
        self._copied: list[Any] = [None] * slots   # events: the slot's last copy is done
        self._consumed: list[Any] = [None] * slots  # events: its last update is done
        self._next = 0
        self.staged = 0
        self.bytes = 0
        self.host_wait_s = 0.0  # the CPU waiting for a slot's last copy before refilling it

    def stage(self, data: Mapping[str, torch.Tensor]) -> Staged:
        """Start moving one batch; its tensors in `data` may be reused once this returns."""
        self.staged += 1
        if not self.copies:
            return Staged(expand_stacks(dict(data)))
        if not self.pin:  # blocking copies into the slot's buffers
            j = self._take_slot()
            dev = self._buffers(self._dev[j], data, self.device, pinned=False)
            for k, v in data.items():
                dev[k].copy_(v)
                self.bytes += v.nbytes
            return Staged(expand_stacks(dict(dev)))
        j = self._take_slot()
        if self._copied[j] is not None and not self._copied[j].query():
            t0 = time.perf_counter()
            self._copied[j].synchronize()
            self.host_wait_s += time.perf_counter() - t0
        host = self._buffers(self._host[j], data, torch.device("cpu"), pinned=True)
        for k, v in data.items():
            host[k].copy_(v)
        dev = self._buffers(self._dev[j], data, self.device, pinned=False)
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            if self._consumed[j] is not None:
                self.stream.wait_event(self._consumed[j])
            for k in data:
                dev[k].copy_(host[k], non_blocking=True)
                self.bytes += host[k].nbytes
            event = torch.cuda.Event()
            event.record(self.stream)
        self._copied[j] = event
        return Staged(expand_stacks(dict(dev)), j)

    def ready(self, staged: Staged) -> dict[str, torch.Tensor]:
        """The batch's tensors, usable by work queued on the current stream from now on."""
        if staged.slot is not None:
            torch.cuda.current_stream(self.device).wait_event(self._copied[staged.slot])
        return staged.data

    def done(self, staged: Staged) -> None:
        """The update that used `staged` is queued: its buffers are free once it ran."""
        if staged.slot is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._consumed[staged.slot] = event

    def put(self, data: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One batch (a rollout), moved and ready at once: for loops with nothing to
        overlap the copy with."""
        staged = self.stage(data)
        out = self.ready(staged)
        self.done(staged)
        return expand_frames(out)

    def _take_slot(self) -> int:
        j = self._next
        self._next = (j + 1) % self.slots
        return j

    @staticmethod
    def _buffers(held: dict[str, torch.Tensor], data: Mapping[str, torch.Tensor],
                 device: torch.device, pinned: bool) -> dict[str, torch.Tensor]:
        """The slot's buffers for `data`'s fields, made anew for a field whose shape or dtype
        changed (a rollout's size varies)."""
        for k, v in data.items():
            have = held.get(k)
            if have is None or have.shape != v.shape or have.dtype != v.dtype:
                held[k] = torch.empty(v.shape, dtype=v.dtype, device=device,
                                      pin_memory=pinned)
        return held

    def status(self) -> dict[str, Any]:
        return {"pinned": self.pin, "double_buffered": self.copies,
                "batches_staged": self.staged, "bytes_staged": self.bytes,
                "host_wait_s": round(self.host_wait_s, 4)}


class GpuClock:
    """The GPU's own time around updates, from CUDA events read only once they have
    happened (never a sync on the training thread). `start`/`end` bracket each update."""

    def __init__(self, device: torch.device, keep: int = 4096, window: int = 1000) -> None:
        self.device = device
        self.enabled = device.type == "cuda"
        self._last_end: Any = None
        self._pending: deque[tuple[Any, Any, Any]] = deque(maxlen=keep)  # (prev end, start, end)
        self._start: Any = None
        self.busy_s = 0.0
        self.wait_s = 0.0
        self.updates = 0
        self._recent: deque[tuple[float, float]] = deque(maxlen=window)  # (busy, wait) s
        self._lock = threading.Lock()  # the training thread (reports) and /status collect

    def start(self) -> None:
        if self.enabled:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self.device))

    def end(self) -> None:
        if not self.enabled or self._start is None:
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        self._pending.append((self._last_end, self._start, end))
        self._last_end, self._start = end, None

    def collect(self) -> None:
        """Add up the updates whose events have happened."""
        with self._lock:
            self._collect()

    def _collect(self) -> None:
        while self._pending and self._pending[0][2].query():
            prev, start, end = self._pending.popleft()
            busy = start.elapsed_time(end) / 1000.0
            wait = 0.0 if prev is None else max(0.0, prev.elapsed_time(start) / 1000.0)
            self.busy_s += busy
            self.wait_s += wait
            self._recent.append((busy, wait))
            self.updates += 1

    def fractions(self) -> dict[str, float | None]:
        """Shares of the GPU's time (busy plus waiting between updates) over the last
        `window` updates, and the seconds of each since the learner started."""
        with self._lock:
            self._collect()
            busy = sum(b for b, _ in self._recent)
            wait = sum(w for _, w in self._recent)
            counted = len(self._recent)
        if not busy + wait:
            return {"gpu_busy_fraction": None, "gpu_wait_fraction": None}
        return {"gpu_busy_fraction": round(busy / (busy + wait), 4),
                "gpu_wait_fraction": round(wait / (busy + wait), 4),
                "gpu_busy_s": round(self.busy_s, 3), "gpu_wait_s": round(self.wait_s, 3),
                "gpu_window_updates": counted}
