"""What a coordinator snapshot holds beside the buffers' indexes: `CoordinatorSnapshot`, a
versioned model, and `SnapshotParts`, which takes it from the parts and gives it back.

The buffers' indexes are numpy arrays in their own safetensors blobs (`Replay.snapshot`);
this model is the JSON the replay writes beside them (`Replay.write_snapshot`'s counters).
Each part owns its piece of the format: the run's counters (`state.SavedCounters`), the
evaluation schedule's (`evaluation.SavedEvaluations`, flat in the snapshot like the
counters) and the task table's (`tasks.SavedTasks`, under `tasks`); the rest is the replay's
ledger, the league's state and the commander's.

`format_version` says which format wrote a snapshot: 0 for those written before the format
had a version, `FORMAT_VERSION` for this one. A snapshot of an older format reads into the
model as it stands, its missing fields taking their defaults (and the parts making up what an
older one lacked); one of a newer format than this coordinator knows is refused, naming both,
rather than read wrong.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from rlfleet.coordinator.env_settings import EnvSettings
from rlfleet.coordinator.evaluation import EvaluationSchedule, SavedEvaluations
from rlfleet.coordinator.state import CoordinatorState, SavedCounters
from rlfleet.coordinator.tasks import SavedTasks, TaskTable
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.base import TaskKind
from rlfleet.shared.league.matchmaking import Matchmaker
from rlfleet.shared.replay.replay import Replay

FORMAT_VERSION = 1


class SnapshotFormatError(ConfigError):
    """A snapshot in storage this coordinator cannot read: written by a newer version, or
    not a coordinator snapshot at all. `rlfleet coordinator --resume` says so and exits 2."""


class CoordinatorSnapshot(SavedCounters, SavedEvaluations):
    """The JSON part of a coordinator snapshot (the replay writes it beside the buffers)."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    format_version: int = 0  # 0: written before the format had a version
    ledger: dict[str, int] = Field(default_factory=dict)  # chunks let go of, by reason
    tasks: SavedTasks = Field(default_factory=SavedTasks)
    league: dict[str, Any] | None = None  # the self-play league's state (its own format)
    commander: Any = None  # the commander's `state_dict` (JSON it chose)

    @classmethod
    def read(cls, saved: dict[str, Any]) -> CoordinatorSnapshot:
        """A snapshot as storage holds it, of this format or an older one."""
        version = saved.get("format_version", 0)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise SnapshotFormatError(f"the coordinator snapshot in storage has "
                                      f"format_version={version!r}, not a format number")
        if version > FORMAT_VERSION:
            raise SnapshotFormatError(
                f"the coordinator snapshot in storage has format_version={version}, newer "
                f"than this coordinator reads (format {FORMAT_VERSION}): resume the run with "
                "the rlfleet version that wrote it, or a newer one")
        try:
            return cls.model_validate(saved)
        except ValidationError as err:
            raise SnapshotFormatError(f"the coordinator snapshot in storage (format "
                                      f"{version}) does not read: {err}") from None


class SnapshotParts:
    """The parts a snapshot saves and a restore gives back, beside the buffers: the run's
    counters, the evaluation schedule, the task table, the replay's ledger, the league
    (`matchmaker`: None for a single-agent run) and the commander (`env_settings`)."""

    def __init__(self, state: CoordinatorState, replay: Replay, tasks: TaskTable,
                 evaluations: EvaluationSchedule, matchmaker: Matchmaker | None,
                 env_settings: EnvSettings) -> None:
        self._state = state
        self._replay = replay
        self._tasks = tasks
        self._evaluations = evaluations
        self._matchmaker = matchmaker
        self._env_settings = env_settings

    def commander_state(self) -> Any:
        """The commander's state, asked before a snapshot is copied and outside the lock:
        it is user code."""
        return self._env_settings.state()

    def capture(self, commander: Any) -> CoordinatorSnapshot:
        """The snapshot of this moment (under the state's lock); `commander`: its state."""
        return CoordinatorSnapshot(
            format_version=FORMAT_VERSION, **dict(self._state.snapshot()),
            **dict(self._evaluations.snapshot()), ledger=dict(self._replay.released_by),
            tasks=self._tasks.snapshot(),
            league=self._matchmaker.state() if self._matchmaker else None,
            commander=commander)

    def restore(self, saved: CoordinatorSnapshot) -> None:
        """Put a snapshot back (under the state's lock; the replay has loaded its own part,
        the ledger, with its buffers). Evaluations the snapshot had running are failed: their
        reports would find no one, so new ones fall due at once. The commander gets its
        state back from the caller, outside the lock (`EnvSettings.load_state`)."""
        state = self._state
        state.restore(saved)
        self._evaluations.restore(saved)
        if self._matchmaker is not None:
            self._matchmaker.restore(saved.league)
        for rec in self._tasks.restore(saved.tasks):
            if rec.kind is TaskKind.EVALUATE:
                self._evaluations.rerun(rec, state.env_steps, state.train_iterations)


__all__ = ["FORMAT_VERSION", "CoordinatorSnapshot", "SnapshotFormatError", "SnapshotParts"]
