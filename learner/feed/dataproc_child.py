"""The data process itself: the learner's sample loop in a process of its own, each answer's
batches written into shared memory, and the policy versions the learner hands over stored.

`DataProcess` (`dataproc.py`, the learner's handle on it) starts it as

    python -m rlfleet.learner.feed.dataproc_child   # never by hand

It reads its settings as one JSON line on stdin and exits when stdin closes, so it never
outlives the learner; its stdout carries only messages (one JSON object a line) and its log
goes to stderr, the learner's log. It imports no torch, so it starts fast and stays small.

Each answer goes into one of `depth + 1` shared-memory slots (files in /dev/shm, mapped by
both processes): `(B, N, ...)` arrays per field, laid out by `_layout` and filled by `_fill`,
then a message naming the slot and the layout. The learner hands a slot back when it asks for
the next batches, so this process runs at most `depth` answers ahead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from rlfleet.learner.feed.sampling import SampleLoop
from rlfleet.learner.feed.shm import SHM_DIR, new_region
from rlfleet.learner.output.weight_relay import WeightRelay
from rlfleet.shared.batching.rows import batch_fields, column_rows, part_rows
from rlfleet.shared.batching.transforms import BatchTransforms
from rlfleet.shared.contract.frames import FRAMES, OBS_STACK, field_layout, stack_index, take
from rlfleet.shared.contract.wire.sampling import MixShare, SampleResponse

log = logging.getLogger("rlfleet.learner")

# The sample loop's flags and counters, mirrored to the learner with every message.
STATE_KEYS = ("rate_limited", "dropped_responses", "sample_wait_s", "fetch_s", "cursor",
              "seen_generation", "broken")


class _Slot:
    """One shared-memory region the data process writes an answer's batches into."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.path: Path | None = None
        self.map: mmap.mmap | None = None
        self.size = 0
        self.generation = 0

    def ensure(self, size: int) -> None:
        """A region of at least `size` bytes; a bigger one under a new name if needed (the
        learner maps it on first sight)."""
        if self.map is not None and self.size >= size:
            return
        self.release()
        self.generation += 1
        self.path = SHM_DIR / f"rlfleet-dp-{os.getpid()}-{self.index}-{self.generation}"
        self.map = new_region(self.path, size)
        self.size = size

    def release(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)


@dataclass
class _Layout:
    """Where each field of one answer's batches lies in its slot: `[offset, dtype, shape]`
    by name, 64-byte aligned, and what fills them (the parts' flat row indices, the
    transformed columns or the frame stacks)."""

    flats: list[np.ndarray]
    starts: list[int]
    fields: list[str]
    computed: list[dict[str, np.ndarray]] | None
    stacks: list[np.ndarray] | None
    prioritized: bool
    places: dict[str, list] = field(default_factory=dict)
    size: int = 0

    def place(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.size = (self.size + 63) // 64 * 64
        self.places[name] = [self.size, dtype.str, list(shape)]
        self.size += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


class ShmWriter(SampleLoop):
    """The sample loop of the data process: each answer into a free slot, one message out."""

    def __init__(self, *args: Any, depth: int, out: IO[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = [_Slot(i) for i in range(depth + 1)]  # +1: the one being learned from
        self.free: queue.Queue[int] = queue.Queue()
        for slot in self.slots:
            self.free.put(slot.index)
        self.out = out
        self._out_lock = threading.Lock()
        self._room: int | None = None  # a free slot, taken before sampling into it

    def assemble(self, resp: SampleResponse, columns: Mapping[str, np.ndarray],
                 offsets: np.ndarray) -> tuple:
        return resp, columns, offsets  # written straight into a slot in `hand`

    def wait_room(self) -> bool:
        while self._room is None and not self._closing.is_set():
            try:
                self._room = self.free.get(timeout=0.5)
            except queue.Empty:
                continue
        return self._room is not None

    def hand(self, answer: tuple) -> None:
        resp, columns, offsets = answer
        index, self._room = self._room, None
        assert index is not None
        t0 = time.perf_counter()
        message = self._write(self.slots[index], resp, columns, offsets)
        self.fetch_s += time.perf_counter() - t0
        self.send({"kind": "batches", **message})

    def _write(self, slot: _Slot, resp: SampleResponse, columns: Mapping[str, np.ndarray],
               offsets: np.ndarray) -> dict:
        """One answer into `slot`: (B, N, ...) arrays per field, plus every part's item ids
        and, when a part is prioritized, the importance weights; batch b is row b of each,
        part p columns [start_p, start_p + n_p)."""
        layout = self._layout(resp, columns, offsets)
        slot.ensure(max(layout.size, 1))
        assert slot.map is not None
        spans = _fill(slot.map, layout, resp, columns)
        refs = [span for span, part in zip(spans, resp.parts, strict=True)
                if part.weights is not None]
        return {"slot": slot.index, "path": str(slot.path), "num_batches": resp.num_batches,
                "layout": layout.places, "refs": refs, "spans": spans, "state": self.state(),
                "moments": self.take_moments()}

    def _layout(self, resp: SampleResponse, columns: Mapping[str, np.ndarray],
                offsets: np.ndarray) -> _Layout:
        """Which fields an answer's batches have, and where each lies."""
        flats, starts, total = [], [], 0
        total_rows, cut = column_rows(columns), columns.get("cut")
        for part in resp.parts:
            flat = part_rows(part, offsets, total_rows, cut)
            flats.append(flat)
            starts.append(total)
            total += flat.shape[1]
        inner = flats[0].shape[2:]  # (L,) for sequence parts
        fields = list(batch_fields(columns))
        transforms = self.transforms
        computed = None
        if transforms is not None and not all(transforms.plain(p.buffer) for p in resp.parts):
            fields = list(transforms.fields(tuple(fields)))  # n-step, relabelled: computed
            computed = [transforms.gather(columns, flat, tuple(fields), part.buffer)
                        for part, flat in zip(resp.parts, flats, strict=True)]
        # Stacked frames: obs and next_obs as one (S+1)-frame stack a row (staging.py)
        stacks: list[np.ndarray] | None = None
        if computed is None and not inner and "obs" in fields and "next_obs" in fields:
            found = [stack_index(columns, flat) for flat in flats]
            present = [s for s in found if s is not None]
            stacks = present if len(present) == len(found) else None
        layout = _Layout(flats, starts, fields, computed, stacks,
                         any(p.weights is not None for p in resp.parts))
        b = resp.num_batches
        if stacks is not None:
            layout.fields = [f for f in fields if f not in ("obs", "next_obs")]
            frames = columns[FRAMES]
            layout.place(OBS_STACK, frames.dtype, (b, total, *stacks[0].shape[2:],
                                                   *frames.shape[1:]))
        for f in layout.fields:
            if computed is None:
                dtype, row_shape = field_layout(columns, f)
            else:
                dtype, row_shape = computed[0][f].dtype, computed[0][f].shape[flats[0].ndim:]
            layout.place(f, dtype, (b, total, *inner, *row_shape))
        if layout.prioritized:
            layout.place("weights", np.dtype(np.float32), (b, total))
        # every part's item ids: priorities go back by them, and the batch log names them
        layout.place("item_ids", np.dtype(np.int64), (b, total))
        return layout

    def state(self) -> dict[str, Any]:
        return {"stop_run": self.stop_run.is_set(), "group_ended": self.group_ended.is_set(),
                "rate_limited": self.rate_limited, "dropped_responses": self.dropped_responses,
                "sample_wait_s": self.sample_wait_s, "fetch_s": self.fetch_s,
                "cursor": self.cursor, "seen_generation": self.seen_generation,
                "broken": self.broken}

    def on_change(self) -> None:
        self.send({"kind": "state", "state": self.state()})

    def send(self, message: dict) -> None:
        with self._out_lock:
            self.out.write(json.dumps(message) + "\n")
            self.out.flush()

    def listen(self, inbox: IO[str], relay: WeightRelay) -> None:
        """Slots handed back and policy versions to store, until stdin closes (the learner
        closed us, or died)."""
        for line in inbox:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                message = json.loads(line)
                if "publish" in message:
                    relay.submit(message)
                else:
                    self.free.put(int(message["free"]))
        self._closing.set()

    def release(self) -> None:
        for slot in self.slots:
            slot.release()


def _fill(region: mmap.mmap, layout: _Layout, resp: SampleResponse,
          columns: Mapping[str, np.ndarray]) -> list[list]:
    """Write an answer's rows into `region` as `layout` says; each part's
    `[buffer, start, n]` (its columns in every field)."""

    def view(name: str) -> np.ndarray:
        offset, dtype, shape = layout.places[name]
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(region, dtype=np.dtype(dtype), count=count,
                             offset=offset).reshape(shape)

    flats, starts = layout.flats, layout.starts
    if layout.stacks is not None:
        dest = view(OBS_STACK)
        for index, start in zip(layout.stacks, starts, strict=True):
            np.take(columns[FRAMES], index, axis=0,
                    out=dest[:, start:start + index.shape[1]] if len(flats) > 1 else dest)
    for f in layout.fields:
        dest = view(f)
        if layout.computed is not None:
            for arrays, flat, start in zip(layout.computed, flats, starts, strict=True):
                dest[:, start:start + flat.shape[1]] = arrays[f]
        elif len(flats) == 1:
            take(columns, f, flats[0], out=dest)
        else:
            for flat, start in zip(flats, starts, strict=True):
                dest[:, start:start + flat.shape[1]] = take(columns, f, flat)
    spans = []
    ids = view("item_ids")
    weights = view("weights") if layout.prioritized else None
    for part, flat, start in zip(resp.parts, flats, starts, strict=True):
        n = flat.shape[1]
        ids[:, start:start + n] = np.asarray(part.item_ids, dtype=np.int64)
        spans.append([part.buffer, start, n])
        if weights is not None:
            weights[:, start:start + n] = (1.0 if part.weights is None else
                                           np.asarray(part.weights, dtype=np.float32))
    return spans


def main() -> int:
    from rlfleet.shared.infra.http import HttpClient
    from rlfleet.shared.infra.storage import open_storage
    from rlfleet.shared.infra.storage.credentials import log_to_stderr

    # Its learner ends it (its stdin closes), after the learner's last publish and checkpoint,
    # which go through this process. A signal for the whole job (Slurm's scancel or requeue
    # signals every process of it, a terminal's Ctrl-C its process group) must not end it
    # first.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    log_to_stderr(os.environ.get("RLFLEET_LOG_LEVEL", "INFO"),
                  "%(asctime)s learner-data %(levelname)s %(name)s: %(message)s")
    settings = json.loads(sys.stdin.readline())
    client = HttpClient(settings["coordinator"], timeout_s=10)
    storage = open_storage(settings["storage"], settings["run"])
    out = sys.stdout
    sys.stdout = sys.stderr  # a stray print must not corrupt the message stream
    writer = ShmWriter(
        client, storage, settings["worker_id"], settings["batch_size"],
        settings["batches_per_request"], settings["cache_size"],
        mix=[MixShare(**m) for m in settings["mix"]] if settings["mix"] else None,
        group_generation=settings["group_generation"], cursor=settings["cursor"],
        depth=settings["depth"], out=out,
        transforms=(BatchTransforms(**settings["transforms"]) if settings.get("transforms")
                    else None))
    relay = WeightRelay(storage, writer.send)
    threading.Thread(target=writer.listen, args=(sys.stdin, relay), name="inbox",
                     daemon=True).start()
    try:
        writer.on_change()  # ready: the learner waits for this first message
        writer.run()
        writer.on_change()
    except (BrokenPipeError, OSError) as err:
        if not writer._closing.is_set():
            log.warning("data process ends: %s", err)
    finally:
        relay.end()  # the version the learner handed over last is stored or refused
        writer.release()
        storage.close()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
