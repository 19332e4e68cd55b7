"""A learner as one rank of a data-parallel group: rendezvous, collectives, re-formation.

The coordinator decides who is in the group: a generation number, each learner's rank, the
world size and rank 0's store address (`GroupAssignment`). This module carries that out with
torch.distributed: gloo for the rendezvous and the state broadcast, and for the gradients'
all-reduce unless every rank has a GPU of its own, when NCCL sums them (`choose_backend`),
through torch's own rendezvous:

- every learner hosts a `TCPStore` from its start, so whichever learner becomes rank 0 of a
  generation already has one listening; the coordinator hands its address to the others;
- each generation meets under its own prefix (`<epoch>/g<generation>/`) in that store, so a group
  re-formed after a death never reads keys of the one before. Each generation is its own
  `ProcessGroupGloo` on that prefixed store, not torch's default group: `init_process_group`
  names groups by a process-wide counter, and one failed rendezvous (a rank that hung through
  it) leaves the counters of two processes apart, so they would wait under different keys
  for ever;
- on forming, rank 0 broadcasts its whole training state (weights, optimizer, counters, as
  safetensors bytes: no pickle) and its policy version, so survivors that stopped one step
  apart and newcomers that loaded an old checkpoint all continue from the same state;
- a rank that dies makes the others' collective fail at once (its sockets close); one that
  hangs (SIGSTOP) is declared dead by the coordinator after its heartbeat timeout, and the
  others stop waiting for it then (`learner/group/collectives.py`), or at the latest after the
  group's own timeout (`learner.collective_timeout_s`); either way `GroupError` tells the
  learner to ask for the next generation.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import socket
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from rlfleet.learner.group.collectives import GroupError, Waiter, never_ends, retire
from rlfleet.shared.contract.codec import decode_weights, encode_weights
from rlfleet.shared.contract.wire.group import GroupAssignment

log = logging.getLogger("rlfleet.learner")

__all__ = ["DistReducer", "GroupError", "GroupMember", "choose_backend"]


def choose_backend(devices: list[str], nccl_available: bool | None = None) -> str:
    """`nccl` when every rank trains on a CUDA device of its own (`host|device` per rank: no
    two ranks on one GPU, which NCCL refuses), `gloo` otherwise (CPU learners, or ranks
    sharing a GPU: gloo sums CUDA tensors through the host)."""
    if nccl_available is None:
        nccl_available = dist.is_nccl_available()
    on_cuda = all(d.partition("|")[2].startswith("cuda") for d in devices)
    return "nccl" if nccl_available and on_cuda and len(set(devices)) == len(devices) \
        else "gloo"


class DistReducer:
    """`Reducer` over one generation's process group: tensors of one dtype travel as one
    flat buffer, so a step's gradients (and whatever statistics ride along) cost one
    all-reduce. Time spent in collectives is counted for `timers/learner/allreduce_ms`.
    Over NCCL (`device` is then this rank's GPU) host tensors travel through the device.

    Over gloo the buffer is a copy even of a single tensor: an all-reduce this rank stops
    waiting for (`waiter`, `learner/group/collectives.py`) may still complete later, and must not
    write into the policy's gradients then."""

    def __init__(self, pg: dist.ProcessGroup, rank: int, world_size: int,
                 device: torch.device | None = None, waiter: Waiter | None = None) -> None:
        self.pg = pg
        self.rank = rank
        self.world_size = world_size
        self.device = device  # set for NCCL: every tensor must be on this rank's GPU
        self.waiter = waiter  # None: wait as the backend does (NCCL's own watchdog)
        self.seconds = 0.0
        self.calls = 0

    def _wait(self, work: dist.Work) -> None:
        if self.waiter is None:
            work.wait()
        else:
            self.waiter.wait(work, "all-reduce")

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        t0 = time.perf_counter()
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        try:
            for group in by_dtype.values():
                if self.waiter is None and len(group) == 1 and group[0].is_contiguous() \
                        and group[0].device == self.device:  # NCCL reduces in place
                    self.pg.allreduce([group[0]]).wait()
                    continue
                flat = torch.cat([t.reshape(-1).to(self.device or t.device) for t in group])
                self._wait(self.pg.allreduce([flat]))
                start = 0
                for t in group:
                    n = t.numel()
                    t.copy_(flat[start:start + n].view_as(t))
                    start += n
        except GroupError:
            raise
        except (RuntimeError, dist.DistError) as err:
            raise GroupError(f"all-reduce failed: {err}") from err
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


class GroupMember:
    """One learner's side of the group: its store, the current generation's process group.

    `ended(stalled_s)` tells a rank waiting for a gloo collective whether the coordinator has
    ended its generation (`learner/group/collectives.py`); the session sets it."""

    def __init__(self, advertise_host: str, port: int = 0, timeout_s: float = 30.0,
                 device: torch.device | None = None) -> None:
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.device = device or torch.device("cpu")  # where this rank's policy learns
        self.backend = "gloo"  # of the current generation's reducer
        self.ended: Callable[[float], bool] = never_ends
        self._waiter = Waiter()  # the current generation's
        # Listens on every interface; the coordinator tells the others `advertise_host`.
        self.store = dist.TCPStore(advertise_host, port, is_master=True,
                                   wait_for_workers=False, timeout=self.timeout)
        self.store_addr = f"{advertise_host}:{self.store.port}"
        self.assignment: GroupAssignment | None = None
        self.reducer: DistReducer | None = None
        self.pg: dist.ProcessGroup | None = None
        self.nccl: dist.ProcessGroup | None = None  # the reducer's, where every rank has a GPU

    @property
    def generation(self) -> int | None:
        return self.assignment.generation if self.assignment else None

    @property
    def rank(self) -> int | None:
        return self.assignment.rank if self.assignment else None

    @property
    def world_size(self) -> int:
        return self.assignment.world_size if self.assignment and self.assignment.rank is not None \
            else 0

    def _rank0_store(self, addr: str) -> dist.Store:
        if addr == self.store_addr:
            return self.store
        host, _, port = addr.rpartition(":")
        try:
            return dist.TCPStore(host, int(port), is_master=False, timeout=self.timeout)
        except (RuntimeError, dist.DistError) as err:
            raise GroupError(f"cannot reach rank 0's store at {addr}: {err}") from err

    def form(self, assignment: GroupAssignment) -> DistReducer | None:
        """Leave the previous generation and join `assignment`'s (no process group for a
        group of one). Raises `GroupError` if the rendezvous times out."""
        self.leave()
        self.assignment = assignment
        self._waiter = Waiter(self.ended)
        if assignment.rank is None or assignment.world_size <= 1:
            return None
        if assignment.store_addr is None:
            raise GroupError(f"generation {assignment.generation} has no store address")
        store = dist.PrefixStore(f"{assignment.epoch}/g{assignment.generation}/",
                                 self._rank0_store(assignment.store_addr))
        try:  # connects to every other rank, or times out
            # torch's stubs declare ProcessGroupGloo a c10d Backend without the collectives
            # (allreduce, broadcast) it has: used here as the process group it serves as
            self.pg = dist.ProcessGroupGloo(  # type: ignore[assignment]
                store, assignment.rank, assignment.world_size, self.timeout)
        except (RuntimeError, dist.DistError, ValueError) as err:
            raise GroupError(f"rendezvous of generation {assignment.generation} failed: "
                             f"{err}") from err
        self.reducer = self._reducer(store, assignment)
        return self.reducer

    def _reducer(self, store: dist.Store, assignment: GroupAssignment) -> DistReducer:
        """The generation's reducer: over NCCL when every rank has a GPU of its own (the
        ranks tell each other their device through the store), else over the gloo group
        that also carries the state broadcast."""
        assert self.pg is not None and assignment.rank is not None
        rank, size = assignment.rank, assignment.world_size
        try:
            store.set(f"device/{rank}", f"{socket.gethostname()}|{self.device}")
            devices = [store.get(f"device/{r}").decode() for r in range(size)]
        except (RuntimeError, dist.DistError) as err:
            raise GroupError(f"device exchange of generation {assignment.generation} "
                             f"failed: {err}") from err
        self.backend = choose_backend(devices)
        if self.backend == "gloo":
            return DistReducer(self.pg, rank, size, waiter=self._waiter)
        try:  # pragma: no cover - needs a GPU per rank (not on the machines tests run on)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self.timeout
            # a Backend in torch's stubs, as ProcessGroupGloo above
            nccl: dist.ProcessGroup = dist.ProcessGroupNCCL(  # type: ignore[assignment]
                dist.PrefixStore("nccl/", store), rank, size, options)
        except (RuntimeError, dist.DistError, ValueError) as err:
            raise GroupError(f"NCCL rendezvous of generation {assignment.generation} failed: "
                             f"{err}") from err
        self.nccl = nccl
        return DistReducer(nccl, rank, size, device=self.device)

    def broadcast_state(self, state: dict[str, torch.Tensor] | None, policy_version: int
                        ) -> tuple[dict[str, torch.Tensor], int]:
        """Rank 0's training state and policy version, on every rank (rank 0 passes its own;
        the others pass None)."""
        assert self.pg is not None
        try:
            if self.rank == 0:
                assert state is not None
                blob = encode_weights(state, {"policy_version": str(policy_version)})
                header = torch.tensor([len(blob)], dtype=torch.int64)
                self._waiter.wait(self.pg.broadcast(header, 0), "state broadcast")
                payload = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
                self._waiter.wait(self.pg.broadcast(payload, 0), "state broadcast")
                return state, policy_version
            header = torch.zeros(1, dtype=torch.int64)
            self._waiter.wait(self.pg.broadcast(header, 0), "state broadcast")
            payload = torch.empty(int(header[0]), dtype=torch.uint8)
            self._waiter.wait(self.pg.broadcast(payload, 0), "state broadcast")
        except GroupError:
            raise
        except (RuntimeError, dist.DistError) as err:
            raise GroupError(f"state broadcast failed: {err}") from err
        tensors, meta = decode_weights(payload.numpy().tobytes())
        return tensors, int(meta["policy_version"])

    def leave(self) -> None:
        """Drop the current process group (a failed one too): its sockets close, so a rank
        still waiting in one of its collectives fails at once. One with a collective left
        behind in flight is dropped once that ends, off this thread (`retire`). The store
        stays."""
        self.reducer = None
        nccl, self.nccl = self.nccl, None
        if nccl is not None:  # pragma: no cover - a GPU per rank
            with contextlib.suppress(RuntimeError, AttributeError, dist.DistError):
                nccl.abort()
        pg, self.pg = self.pg, None
        if pg is not None:
            try:
                pg.abort()
            except (RuntimeError, AttributeError, dist.DistError) as err:
                log.debug("aborting the previous process group: %s", err)
            retire(pg, self._waiter.left_behind)
            del pg

    def close(self) -> None:
        self.leave()
        self.assignment = None
