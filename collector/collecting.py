"""The collect loop: act in the envs, hand each chunk to the adder, keep pace with the
learner, and run the evaluations waiting between chunks.

One thread does all env work (collection and evaluation take turns, so they never fight over
the core); the adder's reporter and writer threads only wait on the network and on storage.

A storage outage never ends the loop: the adder holds chunks it could not write (collection
pauses when it holds `max_held_chunks`), and a policy check that fails keeps the policy at
hand (`collector/acting.py`). Nor does a coordinator outage (killed, restarting, restored from
its snapshot): every request to it that fails, however it fails on the wire, is an
`HttpError`, which the loop rides out, and the reporter keeps what it could not announce.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from rlfleet.collector.acting import Acting, RandomPolicy
from rlfleet.collector.adder import StorageAdder
from rlfleet.collector.counters import CollectorCounters
from rlfleet.collector.evaluator import Evaluator
from rlfleet.collector.inbox import TaskInbox
from rlfleet.collector.saver import EpisodeSaver
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.experience import CollectPermitRequest, CollectPermitResponse
from rlfleet.shared.contract.wire.tasks import CollectTask
from rlfleet.shared.envs.make import make_vector_env, with_env_kwargs
from rlfleet.shared.infra.http import HttpError
from rlfleet.shared.infra.storage import Storage
from rlfleet.shared.rollout.rollout import Chunk, Rollout
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.worker import ALONE, Turns, WorkerAgent

if TYPE_CHECKING:
    import gymnasium as gym

    from rlfleet.shared.rollout.battle import BattleRollout, OpponentPool

log = logging.getLogger("rlfleet.collector")


def wait_for_permit(agent: WorkerAgent, adder: StorageAdder, closing: threading.Event) -> bool:
    """The coordinator said the learner is behind: wait until it has the answer to every
    chunk written here, then (blocking on its side) until collecting may go on. A permit
    lets one chunk in; the throttle stays until an answer lifts it. Returns False to let
    the loop look at evaluations and closing."""
    if not adder.flush(timeout=1.0):
        return False
    if not adder.throttle.is_set():  # the answer to the last chunk lifted it
        return True
    try:
        resp = agent.client.post(
            f"{API}/permits/collect",
            CollectPermitRequest(worker_id=agent.worker_id, wait_s=1.0),
            CollectPermitResponse, timeout_s=15)
    except HttpError as err:
        log.warning("permit request failed: %s", err)
        closing.wait(0.5)
        return False
    if resp.stop:
        adder.halt()
    return resp.granted


class CollectLoop:
    """One run's collection on the loop's thread, from the first chunk to the drain.

    It stops when `closing` is set (the service closes, or the run is over) or when the
    coordinator says stop (`adder.stop`); `run` then drains the adder and closes the run's
    envs, however the loop ended. Its envs, saver, adder and evaluator are its own; storage,
    the acting policy and the counters are lent by the service."""

    def __init__(self, cfg: RunConfig, task: CollectTask, storage: Storage, agent: WorkerAgent,
                 inbox: TaskInbox, acting: Acting, counters: CollectorCounters,
                 closing: threading.Event, evaluate_only: bool = False,
                 turns: Turns = ALONE) -> None:
        self.cfg = cfg
        self.turns = turns  # shared with a learner of this process: a chunk is one turn
        self.task = task
        self.storage = storage
        self.agent = agent
        self.inbox = inbox
        self.acting = acting
        self.counters = counters
        self.closing = closing
        self.battle = cfg.league is not None
        # Nothing to collect for: evaluations only (an offline run's evaluator, or a run
        # whose every buffer is a read-only dataset).
        self.evaluate_only = evaluate_only or not cfg.receiving_buffers
        # The task's env settings (the run's commander) the envs were made with.
        self.env_settings = (task.env_kwargs, task.level_seeds)
        self.env_rebuilds = 0
        self.envs = (None if self.battle or self.evaluate_only
                     else self._make_envs(task, task.seed))
        self.saver = (EpisodeSaver(cfg.collector.save_to, agent.worker_id or "collector",
                                   cfg.env.num_envs, cfg.collector.mode)
                      if cfg.collector.save_to and not self.evaluate_only else None)
        self.adder = StorageAdder(storage, agent.client, lambda: agent.worker_id,
                                  inbox.task_id, cfg.collector.report_interval_s,
                                  max_held_chunks=cfg.collector.max_held_chunks,
                                  on_answer=inbox.on_answer if self.battle else None,
                                  compression=cfg.collector.compression)
        # Where the run is (a restart mid-run): exploration goes on from there, and the
        # random warm-up, which belongs to the run's start, is not played again.
        if agent.info is not None:
            self.adder.global_env_steps = max(self.adder.global_env_steps,
                                              agent.info.env_steps)
        self.evaluator = Evaluator(cfg, storage, agent, counters)
        # Made once something can act in them (a game's opponents with them).
        self.rollout: Rollout | BattleRollout | None = None
        self.pool: OpponentPool | None = None

    def run(self) -> None:
        """Collect (and evaluate) until closing or a stop; then drain."""
        try:
            while not self.closing.is_set() and not self.adder.stop.is_set():
                if not self._ready_to_act():
                    continue  # torch is still loading: look at closing again
                with self.turns:
                    self._run_evaluations()
                if self.evaluate_only:
                    self.closing.wait(0.05)
                    continue
                if self.adder.throttle.is_set() and not wait_for_permit(
                        self.agent, self.adder, self.closing):
                    continue
                self._follow_env_settings()
                self.acting.refresh()
                if self._needs_published_policy():
                    self.closing.wait(0.05)
                    continue
                with self.turns:
                    chunk = self._collect()
                self._add(chunk)
        finally:
            self._drain()

    def halt(self) -> None:
        """Wake the loop if it waits in `add()` for room while storage is down."""
        self.adder.halt()

    # -- steps of the loop ------------------------------------------------------------------

    def _ready_to_act(self) -> bool:
        """Whether something acts, with a rollout to act in: the run's policy once it is
        wanted (False while torch still loads), the random warm-up's until then."""
        acting = self.acting
        if acting.wants_real(self.inbox.evaluations_waiting(), self.adder.global_env_steps):
            if not acting.make_real(timeout=0.1):
                return False
            if self.rollout is not None:
                assert acting.policy is not None  # made by make_real
                self.rollout.policy = acting.policy
                log.info("torch loaded: acting with the %s policy after %d env steps "
                         "at random", self.cfg.algo.name, self.counters.random_steps)
        assert acting.policy is not None
        if self.battle and self.pool is None:
            from rlfleet.shared.rollout.battle import OpponentPool

            self.pool = OpponentPool(self.cfg, acting.spec, self.storage, self.task.seed)
        if self.rollout is None and not self.evaluate_only:
            self.rollout = self._make_rollout()
        return True

    def _make_envs(self, task: CollectTask, seed: int) -> gym.vector.VectorEnv:
        """The run's envs with the task's env settings (the run's commander)."""
        return make_vector_env(with_env_kwargs(self.cfg.env, task.env_kwargs),
                               self.cfg.env.num_envs, seed, task.level_seeds)

    def _follow_env_settings(self) -> None:
        """The coordinator pushed the collect task again with other env settings (its
        commander changed them): make the envs again, and the rollout over them, between
        two chunks. Episodes under way in the old envs are dropped."""
        task = self.inbox.collect
        if task is None or self.envs is None:
            return
        wanted = (task.env_kwargs, task.level_seeds)
        if wanted == self.env_settings:
            return
        self.env_rebuilds += 1
        log.info("env settings changed: making the envs again with kwargs %s%s",
                 task.env_kwargs, "" if task.level_seeds is None
                 else f" and {len(task.level_seeds)} level seeds")
        self.envs.close()
        self.envs = self._make_envs(task, task.seed + 7_919 * self.env_rebuilds)
        self.env_settings = wanted
        if self.rollout is not None:
            env_steps = self.rollout.env_steps
            self.rollout = self._make_rollout()
            self.rollout.env_steps = env_steps

    def _make_rollout(self) -> Rollout | BattleRollout:
        """A rollout that cuts chunks as the run config says (`collector.mode`, ...)."""
        c, policy = self.cfg.collector, self.acting.policy
        assert policy is not None
        if self.pool is not None:
            from rlfleet.shared.rollout.battle import BattleRollout

            assert not isinstance(policy, RandomPolicy)  # games act with no random warm-up
            return BattleRollout(self.cfg, policy, self.pool, self.inbox.next_opponent,
                                 c.chunk_size, c.mode, c.episodes_per_chunk, self.task.seed)
        assert self.envs is not None
        return Rollout(self.envs, policy, c.chunk_size, c.mode, c.episodes_per_chunk)

    def _run_evaluations(self) -> None:
        """Every evaluation waiting, once the run's policy acts (before, they wait)."""
        while self.acting.real:
            task = self.inbox.next_evaluation()
            if task is None:
                return
            self.evaluator.run(task, self.acting, self.pool)

    def _needs_published_policy(self) -> bool:
        """On-policy data must carry the log-probs of a published policy: such a rollout
        waits for the first version."""
        assert self.rollout is not None and self.acting.policy is not None
        return self.rollout.bootstraps and self.acting.policy.version < 0

    def _collect(self) -> Chunk:
        assert self.rollout is not None
        return self.rollout.collect(max(self.adder.global_env_steps, self.rollout.env_steps))

    def _add(self, chunk: Chunk) -> None:
        """Hand `chunk` to the adder (and the saver) and count it."""
        self.acting.acted(len(chunk.arrays["reward"]))
        if self.saver is not None:  # before the adder packs frames
            self.saver.add(chunk.arrays)
        self.adder.add(chunk.arrays, chunk.policy_version, chunk.episode_returns,
                       chunk.episode_lengths, chunk.segments, chunk.timers,
                       chunk.episode_return_components, chunk.games,
                       chunk.opponents_skipped, chunk.obs_moments, chunk.episode_envs)
        self.counters.games_played += len(chunk.games)
        if self.adder.chunks_reported:  # the first chunk is in: torch may have the GIL
            self.acting.torch.start()
        assert self.rollout is not None
        self.counters.env_steps = self.rollout.env_steps
        self.counters.epsilon = self.acting.epsilon(max(self.adder.global_env_steps,
                                                        self.rollout.env_steps))
        self.counters.chunks_written = self.adder.chunks_written
        self.counters.chunks_reported = self.adder.chunks_reported

    def _drain(self) -> None:
        """Send what the adder holds (as far as storage and the coordinator let it), then
        close the run's envs and saver."""
        flushed = self.adder.close()
        self.counters.chunks_reported = self.adder.chunks_reported
        log.info("drained: %d chunks written, %d reported%s", self.adder.chunks_written,
                 self.adder.chunks_reported, "" if flushed else " (the rest could not be sent)")
        if self.envs is not None:
            self.envs.close()
        self.evaluator.close()
        if self.saver is not None:
            self.saver.close()
