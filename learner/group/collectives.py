"""Waiting for a learner group's collectives, and letting go of those the group gave up on.

A gloo collective cannot be cancelled: `Work.wait()` blocks until every rank has taken part
or the process group's timeout (`learner.collective_timeout_s`) has passed, and the group's
`abort()` leaves a collective in flight running. A frozen rank (SIGSTOP, a stalled VM) would
hold the others for that whole timeout, although the coordinator, the authority on who is
alive, declares it dead after its heartbeat timeout and re-forms the group without it.

So a rank waits in slices: `Work.wait(timeout)` returns the moment the collective completes
and raises when the slice runs out, leaving the collective running. Between slices it asks
whether its generation has ended (`ended`: the session's word, from heartbeats and, once the
wait is long, from the coordinator itself); when it has, the rank stops waiting and leaves
the collective behind (`Abandoned`, a `GroupError`: the learner syncs and forms the next
generation). The collective's own timeout stays the backstop for a coordinator that cannot
say, so a rank that is slow but alive is never dropped by a short timer here.

A collective left behind is still in flight. If the frozen rank wakes, it may still
complete, so it must run on buffers of its own, never on the policy's tensors
(`DistReducer` reduces copies). And ProcessGroupGloo's destructor waits for its collectives
in flight, so a process group with one left behind is dropped on a thread of its own once
that collective has ended (`retire`), not by the training thread.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

WAIT_SLICE = datetime.timedelta(seconds=0.1)


class GroupError(RuntimeError):
    """A rendezvous or collective of the current generation failed: re-form the group."""


def never_ends(stalled_s: float) -> bool:
    """The default: nothing tells a rank that its generation ended; the timeout decides."""
    return False


class Abandoned(GroupError):
    """The coordinator moved the group on while this rank waited for a collective."""


@dataclass
class Waiter:
    """How the ranks of one generation wait for their collectives.

    `ended(stalled_s)` says whether the generation has ended, given how long the current
    wait has lasted; it is asked once per slice, on the waiting thread."""

    ended: Callable[[float], bool] = never_ends
    left_behind: list[dist.Work] = field(default_factory=list)

    def wait(self, work: dist.Work, what: str) -> None:
        """Until `work` completes; `GroupError` if it fails, `Abandoned` if the generation
        ends first."""
        start = time.monotonic()
        while True:
            try:
                work.wait(WAIT_SLICE)
                return
            except (RuntimeError, dist.DistError) as err:
                if work.is_completed():  # it failed, or completed as the slice ran out
                    try:
                        work.wait()
                        return
                    except (RuntimeError, dist.DistError) as failed:
                        raise GroupError(f"{what} failed: {failed}") from failed
                timed_out = err  # still in flight
            stalled = time.monotonic() - start
            if self.ended(stalled):
                self.left_behind.append(work)
                raise Abandoned(f"{what} abandoned after {stalled:.1f}s: the coordinator "
                                "ended this generation (a rank declared dead, or the group "
                                "changed)") from timed_out


def retire(pg: dist.ProcessGroup, left_behind: list[dist.Work]) -> None:
    """Drop `pg` without waiting here for the collectives left behind in it: a thread holds
    it until they have ended (completed, or failed at the group's timeout), so whoever lets
    go of it last does not wait in its destructor."""
    if not left_behind:
        return
    threading.Thread(target=_hold_until_done, args=(pg, list(left_behind)),
                     name="retired-process-group", daemon=True).start()


def _hold_until_done(pg: dist.ProcessGroup, works: list[dist.Work]) -> None:
    for work in works:
        with contextlib.suppress(RuntimeError, dist.DistError):
            work.wait()
    del pg  # whoever lets go of it last finds nothing in flight now
