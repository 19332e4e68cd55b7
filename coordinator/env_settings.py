"""The env settings of tasks, as the run's commander (`coordinator.commander`) chooses them.

A collect task lives for the whole run (it moves to another collector when its own dies), so
new settings reach collectors by a new push of the same task: after every evaluation the
commander is asked again for each live collect task's settings, and a task whose settings
changed is updated in the task table (snapshots keep it) and pushed to its collector
again. The collector keeps the newest push of its task and rebuilds its envs between
chunks when the settings differ. Evaluations run with `evaluate_settings()`: by default the
level the collectors play, so the commander sees the progress on it.

The commander's methods run one at a time, under this module's lock. One that raises
stops the run, with the error as its reason: a curriculum that cannot go on must not leave
the run training on a level nobody chose.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from rlfleet.coordinator.tasks import TaskRecord, TaskTable
from rlfleet.shared.contract.commander import (
    FIELD,
    Commander,
    KeepsState,
    ScoresEvaluations,
    TaskEnvSettings,
)
from rlfleet.shared.contract.wire.base import TaskKind
from rlfleet.shared.contract.wire.evaluation import EvaluationResult
from rlfleet.shared.contract.wire.tasks import CollectTask

log = logging.getLogger("rlfleet.coordinator")


class EnvSettings:
    """The coordinator's side of a commander; with none, every task runs `env.kwargs`."""

    def __init__(self, commander: Commander | None, stop: Callable[[str], None]) -> None:
        self.commander = commander
        # What it may optionally do, asked once.
        self._scorer = commander if isinstance(commander, ScoresEvaluations) else None
        self._stateful = commander if isinstance(commander, KeepsState) else None
        self._stop = stop
        # re-entrant: a method that raises stops the run, and stopping snapshots it, which
        # asks the commander for its state on the same thread
        self._lock = threading.RLock()

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """`fn()`'s answer; None when it raised (logged, and the run stops)."""
        with self._lock:
            try:
                return fn()
            except Exception as err:  # user code: logged, and the run stops with it
                log.exception("%s: %s failed", FIELD, what)
                self._stop(f"{FIELD} failed in {what}: {type(err).__name__}: {err}")
                return None

    def _settings(self, worker_id: str, seed: int) -> TaskEnvSettings | None:
        """The commander's settings for a collect task, validated; None when it failed."""
        commander = self.commander
        assert commander is not None

        def ask() -> TaskEnvSettings:
            got = commander.collect_settings(worker_id, seed)
            if isinstance(got, TaskEnvSettings):
                return got
            return TaskEnvSettings.model_validate(got)  # a dict, checked alike
        return self._call("collect_settings", ask)

    def collect_task(self, task: CollectTask, worker_id: str) -> CollectTask:
        """`task` with the commander's settings for it."""
        if self.commander is None:
            return task
        s = self._settings(worker_id, task.seed)
        if s is None:
            return task
        return task.model_copy(update={"env_kwargs": dict(s.env_kwargs),
                                       "level_seeds": s.level_seeds})

    def evaluate_kwargs(self) -> dict[str, Any]:
        if self.commander is None:
            return {}
        commander = self.commander
        got = self._call("evaluate_settings",
                         lambda: TaskEnvSettings(env_kwargs=commander.evaluate_settings()))
        return {} if got is None else dict(got.env_kwargs)

    def on_evaluation(self, result: EvaluationResult, env_kwargs: dict[str, Any],
                      tasks: TaskTable) -> list[TaskRecord]:
        """Tell the commander (`env_kwargs`: what the evaluation ran with), then the live
        collect tasks whose settings it changed (each updated in `tasks`): the caller
        pushes them again."""
        if self.commander is None:
            return []
        commander = self.commander
        self._call("on_evaluation", lambda: commander.on_evaluation(result, dict(env_kwargs)))
        return [rec for rec in tasks.active(TaskKind.COLLECT) if self.refresh(rec, tasks)]

    def refresh(self, rec: TaskRecord, tasks: TaskTable) -> bool:
        """Give a live collect task the commander's settings for it now (a task handed to
        another worker, or changed by an evaluation); whether they changed."""
        task = rec.task
        if self.commander is None or not isinstance(task, CollectTask):
            return False
        s = self._settings(rec.worker_id, task.seed)
        if s is None or (s.env_kwargs == task.env_kwargs
                         and s.level_seeds == task.level_seeds):
            return False
        if tasks.update_task(rec.task_id, {"env_kwargs": dict(s.env_kwargs),
                                           "level_seeds": s.level_seeds}) is None:
            return False
        log.info("%s: %s now runs env kwargs %s%s", rec.worker_id, rec.task_id,
                 s.env_kwargs, "" if s.level_seeds is None
                 else f", {len(s.level_seeds)} level seeds")
        return True

    def solved(self) -> str | None:
        """The commander's reason to end the run as solved, or None."""
        if self.commander is None:
            return None
        why = self._call("solved", self.commander.solved)
        return None if why is None else str(why)

    def score(self, result: EvaluationResult, env_kwargs: dict[str, Any]) -> float | None:
        """How an evaluation ranks for the best policy: the commander's `score`, else (no
        commander, or one without it, or one that failed) the mean return."""
        commander = self._scorer
        if commander is None:
            return result.return_mean

        def ask() -> tuple[float | None]:
            got = commander.score(result, dict(env_kwargs))
            return (None if got is None else float(got),)
        answer = self._call("score", ask)
        return result.return_mean if answer is None else answer[0]

    def state(self) -> Any:
        """The commander's state for a snapshot (JSON; None: it keeps none, or failed)."""
        commander = self._stateful
        if commander is None:
            return None

        def ask() -> Any:
            state = commander.state_dict()
            json.dumps(state)  # a snapshot is JSON: refuse anything else here, by name
            return state
        return self._call("state_dict", ask)

    def load_state(self, state: Any) -> None:
        """Give the commander back its state from the snapshot a resumed run restored."""
        if self.commander is None or state is None:
            return
        commander = self._stateful
        if commander is None:
            log.warning("%s has no load_state_dict: it starts afresh on resume", FIELD)
            return
        self._call("load_state_dict", lambda: commander.load_state_dict(state))
        log.info("%s resumed from its snapshot: %s", FIELD, state)

    def scalars(self) -> dict[str, float]:
        """`commander/<key>` for the `info` scope."""
        if self.commander is None:
            return {}
        commander = self.commander
        got = self._call("scalars", lambda: {f"commander/{k}": float(v)
                                             for k, v in (commander.scalars() or {}).items()})
        return got or {}
