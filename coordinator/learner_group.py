"""The learner group: several learners training one policy, data parallel, elastically.

The coordinator is the group's aggregator, as DI-engine's `LearnerAggregator` is, but the
gradients never pass through it: the ranks all-reduce them among themselves
(torch.distributed, `learner/group/member.py`). What the coordinator owns is who is in the group
and what data each rank learns from:

- **Generations.** Every change of membership (a learner joins, leaves, dies, registers
  again, or reports that a collective failed) starts a new generation. Survivors keep their
  order (rank 0 of the new generation is a survivor, whose state the ranks adopt), then
  newcomers by arrival. The world size is the largest the config can split its batch among
  (`RunConfig.group_problem`); learners beyond it wait as standbys.
- **Shards.** A group batch is sampled once, at the config's global batch size, so rate
  limits and priorities see one learner's traffic; each rank gets a disjoint shard (an
  equal share of every buffer's part of the batch). For on-policy learning a *rollout* of
  whole queue chunks is cut at `rollout_size` rows and its chunks dealt out among the ranks,
  balanced by rows. Shards are kept, numbered, until every rank has asked past them: a rank
  whose answer was lost asks for the same sequence number again and gets the same shard, so
  step k on every rank uses batch k.
- **Held chunks.** Queue chunks of a generation's rollouts are held under one holder id
  (`group-g<N>`); when the generation ends, whatever its rollouts still hold goes back to
  the head of the queue, as a dead learner's chunks do.

Callers hold the coordinator's lock around every method.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from rlfleet.shared.contract.wire.group import GroupAssignment, GroupSyncRequest
from rlfleet.shared.replay.buffers.queue import QueueBuffer
from rlfleet.shared.replay.replay import PartPlan, PartRefs, Replay
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")

MAX_OPEN_ENTRIES = 64  # shard-log entries a slow rank may leave behind before others wait


class StaleGeneration(ValueError):
    """A request made for a generation that has ended (or a rank outside it)."""

    def __init__(self, message: str, field: str = "group_generation") -> None:
        super().__init__(message)
        self.field = field


@dataclass
class _Member:
    worker_id: str
    store_addr: str
    arrival: int


@dataclass
class Reformation:
    generation: int
    reason: str
    world_size: int
    ranks: list[str]
    at: float  # the coordinator's clock

    def to_json(self, started_at: float) -> dict:
        return {"generation": self.generation, "reason": self.reason,
                "world_size": self.world_size, "ranks": self.ranks,
                "at_s": round(self.at - started_at, 3)}


@dataclass
class _Entry:
    """One group sample (several batches) or one rollout, split into one shard per rank."""

    first_seq: int
    count: int  # batches (1 for a rollout)
    shards: list[tuple[list[str], list[PartRefs]]]


@dataclass
class ShardLog:
    """A generation's numbered entries, kept until every rank has asked past them."""

    world_size: int
    next_seq: int = 0
    entries: dict[int, _Entry] = field(default_factory=dict)
    cursors: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cursors = [0] * self.world_size

    def advance(self, rank: int, cursor: int) -> None:
        """Rank `rank` is done with everything before `cursor`; drop what all are done with."""
        self.cursors[rank] = max(self.cursors[rank], cursor)
        done = min(self.cursors)
        for seq in [s for s, e in self.entries.items() if s + e.count <= done]:
            del self.entries[seq]

    def get(self, cursor: int) -> _Entry | None:
        return self.entries.get(cursor)

    def add(self, count: int, shards: list[tuple[list[str], list[PartRefs]]]) -> _Entry:
        entry = _Entry(self.next_seq, count, shards)
        self.entries[entry.first_seq] = entry
        self.next_seq += count
        return entry


def shard_parts(chunk_ids: list[str], parts: list[PartRefs], world_size: int
                ) -> list[tuple[list[str], list[PartRefs]]]:
    """Split every batch of a sample into `world_size` equal, disjoint shards: rank r takes
    columns [r*s, (r+1)*s) of each part (s = the part's batch size / world size). Each shard
    names only the chunks it uses, so a rank reads no chunk it does not learn from."""
    out = []
    for rank in range(world_size):
        sliced = []
        for p in parts:
            s = p.chunk_index.shape[1] // world_size
            cols = slice(rank * s, (rank + 1) * s)
            sliced.append((p, p.chunk_index[:, cols], cols))
        used = np.unique(np.concatenate([ci.reshape(-1) for _, ci, _ in sliced])) \
            if sliced else np.zeros(0, dtype=np.int64)
        remap = np.full(len(chunk_ids), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        shard_parts_ = [PartRefs(p.buffer, p.key, remap[ci], p.rows[:, cols],
                                 p.item_ids[:, cols],
                                 None if p.weights is None else p.weights[:, cols],
                                 p.sequence_length, p.lengths)
                        for p, ci, cols in sliced]
        out.append(([chunk_ids[i] for i in used.tolist()], shard_parts_))
    return out


def deal_rollout(chunk_ids: list[str], lengths: list[int], world_size: int) -> list[list[int]]:
    """Indices of a rollout's chunks per rank, balanced by rows (longest chunk to the rank
    with fewest rows so far), each rank's in the rollout's order."""
    load = [0] * world_size
    share: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(chunk_ids)), key=lambda i: -lengths[i]):
        r = min(range(world_size), key=lambda r: (load[r], r))
        share[r].append(i)
        load[r] += lengths[i]
    return [sorted(s) for s in share]


class LearnerGroup:
    def __init__(self, cfg: RunConfig, clock=time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        # Rendezvous keys live under "<epoch>/g<generation>/" in rank 0's store: a restarted
        # coordinator counts generations from 1 again, under a new epoch.
        self.epoch = uuid.uuid4().hex[:12]
        self.members: dict[str, _Member] = {}
        self._arrivals = 0
        self.generation = 0
        self.ranks: list[str] = []
        self.history: deque[Reformation] = deque(maxlen=50)
        self.reasons: Counter[str] = Counter()
        self.log: ShardLog = ShardLog(1)
        self.learners_desired: int | None = None
        self._forming: list[tuple[str, int]] = []  # rollout chunks taken, not yet dealt
        self._rates: dict[str, deque[tuple[float, int]]] = {}
        self.timers: dict[str, dict[str, float]] = {}
        self.metrics: dict[str, dict[str, float]] = {}

    # -- membership -------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def holder(self) -> str:
        """Whom this generation's rollout chunks are held by in the replay."""
        return f"group-g{self.generation}"

    def max_world(self, candidates: int) -> int:
        for w in range(candidates, 0, -1):
            if self.cfg.group_problem(w) is None:
                return w
        return min(candidates, 1)

    def _reform(self, reason: str, replay: Replay, force: bool = False) -> None:
        """Start the next generation: survivors first (in their old order), then newcomers
        by arrival; as many as the config can split its batch among. Without `force`,
        nothing happens when the ranks would stay as they are (a standby came or went)."""
        survivors = [w for w in self.ranks if w in self.members]
        newcomers = sorted((m for w, m in self.members.items() if w not in survivors),
                           key=lambda m: m.arrival)
        candidates = survivors + [m.worker_id for m in newcomers]
        world = self.max_world(len(candidates))
        if self.learners_desired is not None:
            world = min(world, self.max_world(min(len(candidates), self.learners_desired)))
        if not force and candidates[:world] == self.ranks:
            return
        old_holder = self.holder
        self.generation += 1
        self.ranks = candidates[:world]
        self.log = ShardLog(max(1, world))
        self._forming = []
        self.reasons[reason.split(":", 1)[0]] += 1
        self.history.append(Reformation(self.generation, reason, world, list(self.ranks),
                                        self.clock()))
        requeued = replay.requeue_held_by(old_holder)
        log.info("learner group generation %d: %d rank(s) %s (%s)%s", self.generation, world,
                 self.ranks, reason,
                 f"; {requeued} rollout chunks back to the queue" if requeued else "")

    def sync(self, req: GroupSyncRequest, replay: Replay) -> GroupAssignment:
        """A learner joins, reports a failed collective, or asks for the current generation."""
        member = self.members.get(req.worker_id)
        if member is None:
            self._arrivals += 1
            self.members[req.worker_id] = _Member(req.worker_id, req.store_addr,
                                                  self._arrivals)
            self._reform(f"joined: {req.worker_id}", replay)
        else:
            if member.store_addr != req.store_addr:
                member.store_addr = req.store_addr
                if req.worker_id in self.ranks:
                    self._reform(f"store moved: {req.worker_id}", replay, force=True)
            elif req.broken and req.generation == self.generation:
                self._reform(f"collective failed: {req.worker_id}: {req.broken[:200]}", replay,
                             force=True)
        if req.generation != self.generation:
            # The learner dropped whatever it held for an older generation (or as a learner
            # alone, holding queue chunks under its own id): those go back to the queue.
            replay.requeue_held_by(req.worker_id)
        return self.assignment(req.worker_id)

    def remove(self, worker_id: str, reason: str, replay: Replay) -> bool:
        """A learner left, died or restarted: the next generation goes on without it."""
        if self.members.pop(worker_id, None) is None:
            return False
        self._rates.pop(worker_id, None)
        self.timers.pop(worker_id, None)
        self.metrics.pop(worker_id, None)
        self._reform(f"{reason}: {worker_id}", replay)
        return True

    def resize(self, learners: int, replay: Replay) -> None:
        """An operator wants this many ranks (`rlfleet scale --learners`)."""
        self.learners_desired = learners
        self._reform(f"scaled: {learners} learners wanted", replay)

    def assignment(self, worker_id: str) -> GroupAssignment:
        rank = self.ranks.index(worker_id) if worker_id in self.ranks else None
        store = self.members[self.ranks[0]].store_addr if self.ranks else None
        return GroupAssignment(generation=self.generation, epoch=self.epoch, rank=rank,
                               world_size=self.world_size, store_addr=store,
                               ranks=list(self.ranks), publisher=rank == 0)

    def rank_of(self, worker_id: str, generation: int) -> int:
        if generation != self.generation:
            raise StaleGeneration(f"group_generation={generation} has ended; the group is at "
                                  f"generation {self.generation}: sync again")
        if worker_id not in self.ranks:
            raise StaleGeneration(f"worker {worker_id!r} has no rank in generation "
                                  f"{generation}", "worker_id")
        return self.ranks.index(worker_id)

    # -- shards -----------------------------------------------------------------------------

    def cached(self, rank: int, cursor: int) -> _Entry | None:
        """The entry starting at `cursor` if it was sampled already; raises for a cursor
        that names no entry's start (a rank out of step)."""
        self.log.advance(rank, cursor)
        entry = self.log.get(cursor)
        if entry is None and cursor != self.log.next_seq:
            raise StaleGeneration(f"group_cursor={cursor} is not the start of a group batch "
                                  f"(next is {self.log.next_seq}): sync again", "group_cursor")
        return entry

    def backlog_full(self) -> bool:
        return len(self.log.entries) >= MAX_OPEN_ENTRIES

    def add_batches(self, chunk_ids: list[str], parts: list[PartRefs], count: int) -> _Entry:
        return self.log.add(count, shard_parts(chunk_ids, parts, self.world_size))

    def check_plan(self, plan: list[PartPlan]) -> None:
        for part in plan:
            if part.batch_size % self.world_size:
                raise StaleGeneration(f"the {part.batch_size} items from buffer "
                                      f"{part.buffer!r} cannot be split among "
                                      f"{self.world_size} ranks", "batch_size")

    def form_rollout(self, replay: Replay, buffer: str, rollout_size: int,
                     train_iterations: int, policy_version: int) -> tuple[_Entry | None,
                                                                          list[str]]:
        """Take whole chunks from the queue until a rollout's rows are there, then deal them
        out; (the rollout or None if the queue ran dry first, chunk ids to delete)."""
        buf = replay.buffers[buffer]
        assert isinstance(buf, QueueBuffer)
        dead: list[str] = []
        rows = sum(n for _, n in self._forming)
        while rows < rollout_size and buf.queue:
            need, count = rollout_size - rows, 0
            for entry in buf.queue.values():
                count += 1
                need -= entry.length
                if need <= 0:
                    break
            ids, parts, released = replay.sample([PartPlan(buffer, None, 1)], count,
                                                 train_iterations, policy_version,
                                                 self.holder)
            dead += released
            lengths = parts[0].lengths.tolist() if parts and parts[0].lengths is not None \
                else []
            order = parts[0].chunk_index[:, 0].tolist() if parts else []
            for k, n in zip(order, lengths, strict=True):
                self._forming.append((ids[k], int(n)))
                rows += int(n)
            if not ids:
                break
        if rows < rollout_size:
            return None, dead
        ids = [c for c, _ in self._forming]
        lengths = [n for _, n in self._forming]
        self._forming = []
        shards = []
        for idx in deal_rollout(ids, lengths, self.world_size):
            k = len(idx)
            shards.append(([ids[i] for i in idx], [PartRefs(
                buffer, None, np.arange(k, dtype=np.int64).reshape(k, 1),
                np.zeros((k, 1), dtype=np.int64), np.zeros((k, 1), dtype=np.int64), None,
                None, np.array([lengths[i] for i in idx], dtype=np.int64))]))
        return self.log.add(1, shards), dead

    # -- learn-info -------------------------------------------------------------------------

    def on_learn_info(self, worker_id: str, train_iterations: int, metrics: dict[str, float],
                      timers: dict[str, float]) -> dict[str, float]:
        """Remember a rank's report; the group's metrics: each key averaged over the ranks
        of the current generation that reported it."""
        now = self.clock()
        rates = self._rates.setdefault(worker_id, deque(maxlen=32))
        rates.append((now, train_iterations))
        if timers:  # a report with no new train iteration carries none
            self.timers[worker_id] = dict(timers)
        if metrics:  # a report with no update since the last one carries none
            self.metrics[worker_id] = dict(metrics)
        reporting = [self.metrics[w] for w in self.ranks if w in self.metrics] or [
            self.metrics.get(worker_id, metrics)]
        keys = set().union(*reporting)
        return {k: float(np.mean([m[k] for m in reporting if k in m])) for k in sorted(keys)}

    def updates_per_s(self, worker_id: str) -> float:
        # a copy first (in C, under the interpreter lock): learn-info appends meanwhile
        recent = tuple(self._rates.get(worker_id, ()))
        samples = [s for s in recent if s[0] >= self.clock() - 5.0]
        if len(samples) < 2:
            return 0.0
        (t0, i0), (t1, i1) = samples[0], samples[-1]
        return (i1 - i0) / max(t1 - t0, 1e-9)

    # -- reading ----------------------------------------------------------------------------

    def status(self, started_at: float) -> dict:
        ranks = [{"rank": r, "worker_id": w,
                  "updates_per_s": round(self.updates_per_s(w), 1),
                  "allreduce_ms": round(self.timers.get(w, {}).get("allreduce_ms", 0.0), 3)}
                 for r, w in enumerate(self.ranks)]
        last = self.history[-1].to_json(started_at) if self.history else None
        return {"generation": self.generation, "world_size": self.world_size,
                "ranks": ranks,
                "standby": sorted(w for w in self.members if w not in self.ranks),
                "learners_desired": self.learners_desired,
                "reformations": sum(self.reasons.values()),
                "reformations_by_reason": dict(self.reasons),
                "last_reformation": last,
                "history": [h.to_json(started_at) for h in list(self.history)[-10:]]}

    def scalars(self) -> dict[str, float]:
        """For the `info` scope and /metrics."""
        out = {"cluster/learner_group/generation": float(self.generation),
               "cluster/learner_group/world_size": float(self.world_size),
               "cluster/learner_group/reformations": float(sum(self.reasons.values()))}
        for r, w in enumerate(self.ranks):
            out[f"cluster/learner_group/rank{r}/updates_per_s"] = self.updates_per_s(w)
        return out
