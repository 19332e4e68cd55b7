"""The coordinator's task table across a restart: a snapshot's live tasks come back, waiting
for their workers, whichever version of the coordinator wrote the snapshot."""

from __future__ import annotations

from rlfleet.coordinator.tasks import SavedTasks, TaskTable
from rlfleet.shared.contract.wire.base import TaskKind, TaskState
from rlfleet.shared.contract.wire.tasks import CollectTask


def test_a_snapshot_whose_collect_task_copies_the_chunking_settings_restores():
    """Collect tasks once carried `collector.mode`, `chunk_size` and `episodes_per_chunk`;
    the collector reads them from the run config now, and a snapshot of then still loads."""
    saved = {"next_id": 3, "tasks": [
        {"task": {"kind": "collect", "task_id": "collect-1", "seed": 5, "mode": "episodes",
                  "chunk_size": 128, "episodes_per_chunk": 2, "env_kwargs": {"size": 3}},
         "worker_id": "c1", "reassignments": 1},
        {"task": {"kind": "learn", "task_id": "learn-2", "seed": 0}, "worker_id": "l1"}]}
    table = TaskTable()
    restored = table.restore(SavedTasks.model_validate(saved))
    assert [r.state for r in restored] == [TaskState.UNASSIGNED] * 2
    assert restored[0].task == CollectTask(task_id="collect-1", seed=5, env_kwargs={"size": 3})
    assert restored[0].reassignments == 1
    assert table.claim("c1", TaskKind.COLLECT).task_id == "collect-1"
    again = TaskTable()
    again.restore(table.snapshot())
    assert [r.task for r in again.active()] == [r.task for r in restored]
