"""A data process for the learner: sample requests, chunk reads, decoding and batch assembly
in a process of its own, ready batches in shared memory.

With a small network an update takes about a millisecond, and a prefetch thread in the same
process (JSON, decoding, fancy-indexing) holds the GIL just when the training thread comes
back from a torch call, so the learner falls well short of the update rate of the same loop
fed from memory (bench/RESULTS.md). Here the training thread is alone with its GIL. As in
Sample Factory, the batches never cross a pipe: the data process writes each answer's batches
into one of a few shared-memory slots (files in /dev/shm, mapped by both processes) and sends
a one-line JSON message naming the slot and the layout; the learner maps the slot once and
wraps the rows in torch tensors without a copy. It hands a slot back when it asks for the next
batches, so the data process can run at most `depth` answers ahead.

The data process imports no torch, so it starts fast and stays small. It reads its
settings as one JSON line on stdin and exits when stdin closes, so it never outlives the
learner. Its stdout carries only messages; its log goes to stderr, the learner's log.

It also stores the policy versions the learner publishes (`learner/weight_relay.py`), which
takes their encoding and writing off the training process's GIL.

    python -m rlfleet.learner.dataproc   # started by `DataProcess`, never by hand
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from rlfleet.learner.sampling import SampleLoop
from rlfleet.learner.shm import SHM_DIR, new_region
from rlfleet.learner.weight_relay import RelayClient, RelayUnavailable, WeightRegion, WeightRelay
from rlfleet.shared.batching.rows import batch_fields, column_rows, part_rows
from rlfleet.shared.batching.transforms import BatchTransforms
from rlfleet.shared.contract.frames import FRAMES, OBS_STACK, field_layout, stack_index, take
from rlfleet.shared.contract.wire.sampling import MixShare, SampleResponse

log = logging.getLogger("rlfleet.learner")

STATE_KEYS = ("rate_limited", "dropped_responses", "sample_wait_s", "fetch_s", "cursor",
              "seen_generation", "broken")


class DataProcessError(RuntimeError):
    """The data process exited, or could not start."""


# -- the data process ---------------------------------------------------------------------

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
        """Lay out (B, N, ...) arrays per field, plus weights and item ids when a part is
        prioritized; batch b is row b of each, part p columns [start_p, start_p + n_p)."""
        num_batches = resp.num_batches
        flats, starts, total = [], [], 0
        total_rows, cut = column_rows(columns), columns.get("cut")
        for part in resp.parts:
            flat = part_rows(part, offsets, total_rows, cut)
            flats.append(flat)
            starts.append(total)
            total += flat.shape[1]
        inner = flats[0].shape[2:]  # (L,) for sequence parts
        layout: dict[str, list] = {}
        size = 0

        def place(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
            nonlocal size
            size = (size + 63) // 64 * 64
            layout[name] = [size, dtype.str, list(shape)]
            size += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

        fields = batch_fields(columns)
        transforms = self.transforms
        computed: list[dict[str, np.ndarray]] | None = None
        if transforms is not None and not all(transforms.plain(p.buffer) for p in resp.parts):
            fields = transforms.fields(fields)  # n-step, relabelled, rewards set: computed
            computed = [transforms.gather(columns, flat, fields, part.buffer)
                        for part, flat in zip(resp.parts, flats, strict=True)]
        # Stacked frames: obs and next_obs as one (S+1)-frame stack a row (learner/staging.py)
        stacks = None
        if computed is None and not inner and "obs" in fields and "next_obs" in fields:
            stacks = [stack_index(columns, flat) for flat in flats]
            if any(s is None for s in stacks):
                stacks = None
        if stacks is not None:
            fields = [f for f in fields if f not in ("obs", "next_obs")]
            frames = columns[FRAMES]
            place(OBS_STACK, frames.dtype,
                  (num_batches, total, *stacks[0].shape[2:], *frames.shape[1:]))
        for f in fields:
            if computed is None:
                dtype, row_shape = field_layout(columns, f)
            else:
                dtype, row_shape = computed[0][f].dtype, computed[0][f].shape[flats[0].ndim:]
            place(f, dtype, (num_batches, total, *inner, *row_shape))
        prioritized = any(p.weights is not None for p in resp.parts)
        if prioritized:
            place("weights", np.dtype(np.float32), (num_batches, total))
        # every part's item ids: priorities go back by them, and the batch log names them
        place("item_ids", np.dtype(np.int64), (num_batches, total))
        slot.ensure(max(size, 1))
        assert slot.map is not None

        def view(name: str) -> np.ndarray:
            offset, dtype, shape = layout[name]
            count = int(np.prod(shape, dtype=np.int64))
            return np.frombuffer(slot.map, dtype=np.dtype(dtype), count=count,
                                 offset=offset).reshape(shape)

        if stacks is not None:
            dest = view(OBS_STACK)
            for index, start in zip(stacks, starts, strict=True):
                np.take(columns[FRAMES], index, axis=0,
                        out=dest[:, start:start + index.shape[1]] if len(stacks) > 1 else dest)
        for f in fields:
            dest = view(f)
            if computed is not None:
                for arrays, flat, start in zip(computed, flats, starts, strict=True):
                    dest[:, start:start + flat.shape[1]] = arrays[f]
            elif len(flats) == 1:
                take(columns, f, flats[0], out=dest)
            else:
                for flat, start in zip(flats, starts, strict=True):
                    dest[:, start:start + flat.shape[1]] = take(columns, f, flat)
        refs, spans = [], []
        ids = view("item_ids")
        for part, flat, start in zip(resp.parts, flats, starts, strict=True):
            n = flat.shape[1]
            ids[:, start:start + n] = np.asarray(part.item_ids, dtype=np.int64)
            spans.append([part.buffer, start, n])
        if prioritized:
            weights = view("weights")
            for part, flat, start in zip(resp.parts, flats, starts, strict=True):
                n = flat.shape[1]
                if part.weights is None:
                    weights[:, start:start + n] = 1.0
                else:
                    weights[:, start:start + n] = np.asarray(part.weights, dtype=np.float32)
                    refs.append([part.buffer, start, n])
        return {"slot": slot.index, "path": str(slot.path), "num_batches": num_batches,
                "layout": layout, "refs": refs, "spans": spans, "state": self.state(),
                "moments": self.take_moments()}

    def state(self) -> dict[str, Any]:
        return {"stop_run": self.stop_run.is_set(), "group_ended": self.group_ended.is_set(),
                **{k: getattr(self, k) for k in STATE_KEYS}}

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


def main() -> int:
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
    from rlfleet.shared.infra.http import HttpClient
    from rlfleet.shared.infra.storage import open_storage

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


# -- the learner's side -------------------------------------------------------------------

class DataProcess:
    """What the training loop sees: `get()` the next answer's batches, flags and counters
    mirrored from the data process (the same as `Prefetcher`'s)."""

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
            [sys.executable, "-m", "rlfleet.learner.dataproc"], stdin=subprocess.PIPE,
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
            # views, not copies: only a logged update copies them (learner/batch_log.py)
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

    def put_weights(self, version: int, state: Mapping[str, Any],
                    metadata: Mapping[str, str]) -> None:
        """Store a policy version through the data process (`learner/weight_relay.py`)."""
        if self.relay is None:
            raise RelayUnavailable("the data process has not started")
        self.relay.put_weights(version, state, metadata)

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


if __name__ == "__main__":
    sys.exit(main())
