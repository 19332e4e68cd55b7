"""The collector service: the worker that runs envs with the newest policy, writes chunks and
evaluates on request.

The service is the glue between the coordinator and the loop: it accepts pushed tasks into
its inbox (`collector/inbox.py`), starts the loop's thread on the first collect task, reports
how the collect task ended (or crashed), and answers `/status` and the heartbeat from the
loop's counters. What acts is `collector/acting.py`, the loop `collector/collecting.py`, the
evaluations `collector/evaluator.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from rlfleet.collector.acting import Acting, PolicyRefresher
from rlfleet.collector.adder import StorageAdder
from rlfleet.collector.collecting import CollectLoop
from rlfleet.collector.counters import CollectorCounters
from rlfleet.collector.evaluator import EvaluationCrashed
from rlfleet.collector.inbox import TaskInbox
from rlfleet.collector.torch_loader import TorchLoader
from rlfleet.shared.contract.wire.base import Role
from rlfleet.shared.contract.wire.tasks import CollectTask, EvaluateTask, TaskAccepted, TaskEnvelope
from rlfleet.shared.infra.storage import open_storage
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.worker import WorkerService

if TYPE_CHECKING:
    pass

log = logging.getLogger("rlfleet.collector")


class CollectorService(WorkerService):
    """One collector process. What outlives a run's loop lives here: the inbox (tasks come
    before the loop starts), the counters (`/status` answers before it starts too), the torch
    loader (torch is imported once per process) and the policy refresher."""

    role = Role.COLLECTOR

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inbox = TaskInbox()
        self.counters = CollectorCounters()
        self.torch = TorchLoader()  # one per process: it imports torch once
        self.refresher = PolicyRefresher(self.counters)
        self.evaluate_only = False  # collect nothing, only evaluate (--evaluate-only)
        self.error: str | None = None
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: CollectLoop | None = None  # the run's loop, once the thread made it
        self._t0 = time.monotonic()

    # -- tasks ------------------------------------------------------------------------------

    def accept(self, envelope: TaskEnvelope) -> TaskAccepted:
        task = envelope.task
        if isinstance(task, CollectTask):
            self.inbox.put_collect(task)
            self._start_loop()
        elif isinstance(task, EvaluateTask):
            self.inbox.put_evaluation(task)
        else:
            return TaskAccepted(task_id=task.task_id, accepted=False)
        return TaskAccepted(task_id=task.task_id, accepted=True)

    def _start_loop(self) -> None:
        """Start the loop's thread, once: a collect task pushed again (the coordinator
        restarted) replaces the inbox's task, not the loop."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run_guarded, name="collect",
                                                daemon=True)
                self._thread.start()

    def _end_collect_task(self, error: str | None = None) -> None:
        task = self.inbox.collect
        if task is not None:
            self.agent.end_task(task.task_id, error)

    # -- the loop's thread ------------------------------------------------------------------

    def _run_guarded(self) -> None:
        """Run the loop, then say how the collect task ended. A crash is reported to the
        coordinator (an evaluation's crash as its own task's failure first), then the
        process stops."""
        try:
            self._run()
            self._end_collect_task()
        except EvaluationCrashed as crash:  # the evaluation's task is what failed
            err = crash.__cause__ or crash
            where = f"evaluation {crash.task_id}"
            self._crashed(err, where)
            self.agent.end_task(crash.task_id, f"evaluation crashed: {self.error}")
            self._end_collect_task(f"collector crashed in {where}: {self.error}")
            self.fail(err, where)
        except Exception as err:  # reported to the coordinator, then the process stops
            self._crashed(err, "collection")
            self._end_collect_task(self.error)
            self.fail(err, "collection")

    def _crashed(self, err: BaseException, where: str) -> None:
        log.error("collector crashed in %s", where, exc_info=err)
        self.error = f"{type(err).__name__}: {err}"

    def _config(self) -> RunConfig | None:
        """The run's config. The loop starts on a pushed task, which can come before the
        registration's answer that brings the config; if the coordinator died in between, the
        answer comes from its restarted process, however long that takes: no time limit to
        crash on, only closing (then None)."""
        while not self.configured.wait(0.5):
            if self._closing.is_set():
                return None
        return self.wait_config(0)

    def _run(self) -> None:
        cfg = self._config()
        if cfg is None:
            return
        if cfg.env.backend == "sync":  # env workers of their own (processes, threads) are
            self.turns.settle()        # free to run elsewhere
        task = self.inbox.collect
        assert task is not None
        # A short retry window: during an outage the adder holds chunks and the envs go on,
        # rather than the whole loop waiting inside one write.
        storage = open_storage(self.storage_url, cfg.name, max_retry_s=1.0)
        try:
            acting = Acting(cfg, task.seed, storage, self.torch, self.refresher, self.counters,
                            fixed_epsilon=task.epsilon, apex_slot=task.apex_slot)
            loop = CollectLoop(cfg, task, storage, self.agent, self.inbox, acting,
                               self.counters, self._closing, self.evaluate_only, self.turns)
            self._loop = loop
            if self._closing.is_set():  # closed while starting: an add() must not wait
                loop.halt()
            loop.run()
        finally:
            storage.close()

    # -- what tests drive without the loop --------------------------------------------------

    # -- reporting --------------------------------------------------------------------------

    @property
    def adder(self) -> StorageAdder | None:
        """The run's adder, once the loop has made it."""
        loop = self._loop
        return loop.adder if loop is not None else None

    def heartbeat_status(self) -> dict[str, float]:
        held, failures = self._storage_counters()
        c = self.counters
        out = {"env_steps": float(c.env_steps), "policy_version": float(c.policy_version),
               "chunks_held": float(held), "write_failures": float(failures)}
        if c.epsilon is not None:  # what it explores with: `rlfleet status` shows it
            out["epsilon"] = float(c.epsilon)
        if c.apex_slot is not None:
            out["apex_slot"] = float(c.apex_slot)
        return out

    def _storage_counters(self) -> tuple[int, int]:
        """(chunks held, failed writes) of the adder, read live: while storage is down the
        loop may be waiting inside `add()` for room."""
        adder = self.adder
        return (adder.chunks_held, adder.write_failures) if adder else (0, 0)

    def status(self) -> dict[str, Any]:
        c = self.counters
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        held, failures = self._storage_counters()
        return {"task_id": self.inbox.task_id(), "env_steps": c.env_steps,
                "env_steps_per_s": round(c.env_steps / elapsed, 1),
                "policy_version": c.policy_version, "policy_loads": c.policy_loads,
                "chunks_written": c.chunks_written, "chunks_reported": c.chunks_reported,
                "chunks_held": held, "write_failures": failures,
                "evaluations": c.evaluations, "error": self.error,
                "random_warmup_env_steps": c.random_steps,
                "games_played": c.games_played, "epsilon": c.epsilon,
                "apex_slot": c.apex_slot}

    # -- stopping ---------------------------------------------------------------------------

    def on_run_stopped(self) -> None:
        self._closing.set()
        self._halt_loop()

    def close(self) -> None:
        self._closing.set()
        self._halt_loop()
        if self._thread is not None:
            self._thread.join(timeout=15)
        super().close()

    def _halt_loop(self) -> None:
        """Wake the loop if it waits in `add()` for room while storage is down."""
        loop = self._loop
        if loop is not None:
            loop.halt()
