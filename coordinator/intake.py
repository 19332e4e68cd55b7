"""What goes into the replay, and every journalled change to it, made the same way live and
on a restore.

A chunk report, a buffer loaded or cleared by request, queue chunks a learner used up and a
league change are journalled before they are made (`Durability`); a restarted coordinator
replays the journal through this same object, so a change made live and the same change
replayed cannot differ. `Intake` is built before `Durability`, which replays into it, and
before the data plane, which makes the live changes through it: neither needs the other to
exist first. Every method runs with the state's lock held.
"""

from __future__ import annotations

import logging
from typing import Any

from rlfleet.coordinator.membership import Membership
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.sampling import Consumed
from rlfleet.shared.league.matchmaking import Matchmaker
from rlfleet.shared.replay.replay import Replay

log = logging.getLogger("rlfleet.coordinator")

CONSUMED_EVENT = "consumed"  # the journal's record of queue chunks a learner used up
CLEARED_EVENT = "buffer_cleared"  # ... of a buffer emptied by request
LOADED_EVENT = "buffer_loaded"  # ... of chunks loaded into one buffer by request


def consumed_event(consumed: list[Consumed]) -> dict[str, Any]:
    return {"kind": CONSUMED_EVENT, "consumed": [c.model_dump(mode="json") for c in consumed]}


def cleared_event(buffer: str) -> dict[str, Any]:
    return {"kind": CLEARED_EVENT, "buffer": buffer}


def loaded_event(buffer: str, chunks: list[ChunkMeta],
                 priorities: list[list[float]] | None) -> dict[str, Any]:
    return {"kind": LOADED_EVENT, "buffer": buffer,
            "chunks": [c.model_dump(mode="json") for c in chunks], "priorities": priorities}


class Intake:
    """Indexes chunks in the replay and counts them; applies journalled events."""

    def __init__(self, state: CoordinatorState, replay: Replay, members: Membership,
                 matchmaker: Matchmaker | None) -> None:
        self._state = state
        self._replay = replay
        self._members = members
        self._matchmaker = matchmaker

    def accept(self, metas: list[ChunkMeta], worker_id: str
               ) -> tuple[list[ChunkMeta], list[str]]:
        """Index journalled chunks of a report and count them; (fresh, dead ids)."""
        fresh, dead = self._replay.insert(metas, self._state.train_iterations)
        self._state.count_chunks(fresh)
        if self._matchmaker is not None:
            self._matchmaker.on_chunks(fresh)
        self._members.count_chunks(worker_id, len(fresh))
        return fresh, dead

    def load(self, name: str, metas: list[ChunkMeta],
             priorities: list[list[float]] | None) -> list[str]:
        """Index loaded chunks in one buffer and count them as acknowledged (the ledger),
        not as env steps; returns the chunk ids to delete."""
        fresh, dead = self._replay.load_into(name, metas, self._state.train_iterations,
                                             priorities)
        self._state.chunks_accepted += len(fresh)
        return dead

    def replay_event(self, event: dict[str, Any]) -> list[str]:
        """A journalled change that is not a chunk report, replayed by a restore: a
        consumption of queue chunks, a buffer cleared or loaded, or a league change. Returns
        the ids of the chunks it released."""
        kind = event.get("kind")
        if kind == CONSUMED_EVENT:
            consumed = [Consumed.model_validate(c) for c in event["consumed"]]
            return self._replay.consume(consumed, replaying=True)
        if kind in (CLEARED_EVENT, LOADED_EVENT) and event["buffer"] not in self._replay.buffers:
            log.warning("journal: buffer %s is not in the config any more: its %s is "
                        "skipped", event["buffer"], kind)
            return []
        if kind == CLEARED_EVENT:
            return self._replay.clear(event["buffer"])[2]
        if kind == LOADED_EVENT:
            return self.load(event["buffer"], [ChunkMeta.model_validate(c)
                                               for c in event["chunks"]],
                             event.get("priorities"))
        if self._matchmaker is not None:
            self._matchmaker.apply(event)
        return []


__all__ = ["CLEARED_EVENT", "CONSUMED_EVENT", "LOADED_EVENT", "Intake", "cleared_event",
           "consumed_event", "loaded_event"]
