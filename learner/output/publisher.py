"""Publishing policy versions from a thread of its own, so the update loop never waits on
storage.

At tens of versions a second, encoding and writing each one on the training thread would
take from the learner's updates (and a storage outage would stop training outright). The
training thread only hands over a copy of the policy's tensors; this thread encodes and
writes it. When versions come faster than storage takes them, the newest pending state wins:
collectors only ever want the latest policy, and version numbers stay consecutive because a
number is given when a state is written, not when it is handed over.

Where a version is written is a `WeightSink`: storage itself (`StorageSink`), or, while the
learner has a data process, that process's relay (`RelaySink`, `learner/output/weight_relay.py`:
this thread then only copies a state into shared memory), which falls back on storage when
the relay cannot take a version. The feed of each generation says which (`Feed.weight_sink`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Protocol

import torch

from rlfleet.learner.output.weight_relay import RelayUnavailable
from rlfleet.shared.contract.codec import decode_weights, encode_weights
from rlfleet.shared.infra.storage import Storage, StorageError, VersionConflict
from rlfleet.shared.util.backoff import Backoff

log = logging.getLogger("rlfleet.learner")



class WeightSink(Protocol):
    """Where policy versions are written."""

    def put(self, version: int, state: Mapping[str, torch.Tensor],
            metadata: Mapping[str, str]) -> bool:
        """Store one version; whether another process stored it for this one (a data
        process's relay) rather than this thread. `StorageError` while storage is out (the
        publisher retries), `VersionConflict` when another learner stored it first."""


class StorageSink:
    """Versions encoded and written to storage by the publish thread."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def put(self, version: int, state: Mapping[str, torch.Tensor],
            metadata: Mapping[str, str]) -> bool:
        self.storage.put_weights(version, encode_weights(state, metadata))
        return False


class RelaySink:
    """Versions handed to a data process, which encodes and writes them
    (`learner/output/weight_relay.py`); one it cannot take is written to storage here."""

    def __init__(self, relay: Relay, storage: Storage) -> None:
        self.relay = relay
        self.storage = storage

    def put(self, version: int, state: Mapping[str, torch.Tensor],
            metadata: Mapping[str, str]) -> bool:
        try:
            self.relay.put(version, state, metadata)
            return True
        except RelayUnavailable as err:
            log.info("policy version %d is stored by the learner: %s", version, err)
        try:
            self.storage.put_weights(version, encode_weights(state, metadata))
        except VersionConflict:
            if not _holds(self.storage, version, state, metadata):
                raise
        return False


class Relay(Protocol):
    """A data process's end of the relay (`weight_relay.RelayClient`)."""

    def put(self, version: int, state: Mapping[str, torch.Tensor],
            metadata: Mapping[str, str]) -> None:
        """Store it, or raise `RelayUnavailable` (or storage's errors, as storage would)."""


class PublishConflict(RuntimeError):
    """Another learner published the version this one was about to: it is not the
    publisher any more."""


class Publisher:
    def __init__(self, closing: threading.Event) -> None:
        self._closing = closing
        self._cond = threading.Condition()
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None
        self._writing = False
        self._storage: Storage | None = None
        self._thread: threading.Thread | None = None
        self.version = -1          # the newest version in storage
        self.written = 0           # versions written
        self.superseded = 0        # states replaced by a newer one before they were written
        self.seconds = 0.0         # this thread's time encoding and writing
        self.failure: PublishConflict | None = None
        self._stopped = False
        self._gave_up = False  # the last write was abandoned: storage out while closing
        self._sink: WeightSink | None = None  # None: storage, from this thread
        self.relayed = 0           # versions a sink other than storage stored
        self._last_submit = -float("inf")

    def attach(self, storage: Storage, version: int) -> None:
        """Write to `storage` from now on, the next version being `version + 1`."""
        with self._cond:
            self._storage = storage
            self.version = version
            self.failure = None
            self._gave_up = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="publish", daemon=True)
                self._thread.start()

    def use(self, sink: WeightSink | None) -> None:
        """Store versions through `sink` from the next write on (a generation's feed says
        where: `Feed.weight_sink`); None writes them to storage from this thread."""
        with self._cond:
            self._sink = sink

    def due(self, min_interval_s: float) -> bool:
        """At least `min_interval_s` since a state was last handed over. A version costs
        the learner's process its copy and a line on a pipe, and its data process an encode
        and a write, whether or not any collector loads it before the next one."""
        return time.monotonic() - self._last_submit >= min_interval_s

    def submit(self, state: Mapping[str, torch.Tensor], train_iterations: int) -> None:
        """Hand over a state to publish (the caller must not change its tensors: pass a copy,
        as `Policy.policy_state()` makes). Raises `PublishConflict` if an earlier write found
        another publisher."""
        with self._cond:
            self._raise_failure()
            if self._pending is not None:
                self.superseded += 1
            self._pending = (dict(state), train_iterations)
            self._last_submit = time.monotonic()
            self._cond.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything handed over is in storage (or failed); False on timeout or
        when closing with a write still pending."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._pending is not None or self._writing:
                if self.failure is not None:
                    break
                left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._cond.wait(left)
            self._raise_failure()
            return not self._gave_up

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is pending (unless storage is out and the service is closing), then
        end the thread."""
        with contextlib.suppress(PublishConflict):  # the other publisher's versions stand
            self.flush(timeout_s)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _raise_failure(self) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            self._pending = None
            raise failure

    def _run(self) -> None:
        torch.set_num_threads(1)
        while True:
            with self._cond:
                while self._pending is None:
                    if self._stopped:
                        return
                    self._cond.wait(0.5)
                state, iterations = self._pending
                self._pending = None
                if self._gave_up and self._closing.is_set():  # storage is out: so is this
                    self._cond.notify_all()
                    continue
                self._writing = True
                storage, version = self._storage, self.version + 1
            try:
                self._write(storage, state, iterations, version)
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()

    def _write(self, storage: Storage | None, state: dict[str, torch.Tensor], iterations: int,
               version: int) -> None:
        """Write one version; while storage is out (a Redis restart) retry with backoff, a
        newer state replacing this one meanwhile, because versions must reach collectors in
        order and without gaps."""
        assert storage is not None
        t0 = time.perf_counter()
        backoff = Backoff(0.1, 5.0)
        while True:
            try:
                self._store(storage, version, state, {"policy_version": str(version),
                                                      "train_iterations": str(iterations)})
                break
            except VersionConflict as err:
                with self._cond:
                    self.failure = PublishConflict(f"not the publisher any more: {err}")
                    self._pending = None
                return
            except StorageError as err:
                delay = backoff.next()
                log.warning("could not publish policy version %d (retrying in %.1fs): %s",
                            version, delay, err)
                if self._closing.wait(delay):
                    with self._cond:
                        self._gave_up = True
                    return
                with self._cond:  # a newer state is a better use of this version number
                    if self._pending is not None:
                        (state, iterations), self._pending = self._pending, None
                        self.superseded += 1
        with self._cond:
            self.version = version  # only once it is in storage
            self.written += 1
            self._gave_up = False
        self.seconds += time.perf_counter() - t0

    def _store(self, storage: Storage, version: int, state: dict[str, torch.Tensor],
               metadata: dict[str, str]) -> None:
        with self._cond:
            sink = self._sink
        if sink is None:
            storage.put_weights(version, encode_weights(state, metadata))
            return
        if sink.put(version, state, metadata):
            self.relayed += 1


def _holds(storage: Storage, version: int, state: Mapping[str, torch.Tensor],
           metadata: Mapping[str, str]) -> bool:
    """Storage holds this very version already: the data process stored it and died before
    it could say so. (safetensors orders the metadata as it likes, so compare contents, not
    bytes.)"""
    got = storage.get_weights(version)
    if got is None:
        return False
    tensors, meta = decode_weights(got[1])
    return meta == dict(metadata) and tensors.keys() == state.keys() and all(
        torch.equal(tensors[k], state[k].detach().cpu()) for k in state)
