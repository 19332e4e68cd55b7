"""What grows with a run stays bounded: the evaluation window and its pages, ended tasks, and
departed workers. A run left for a week reports about a million evaluations."""

from __future__ import annotations

import threading
from collections import deque

import pytest

from rlfleet.coordinator import evaluation, membership, tasks
from rlfleet.coordinator.evaluation import EvaluationSchedule, SavedEvaluations
from rlfleet.coordinator.membership import Membership
from rlfleet.coordinator.tasks import TaskTable
from rlfleet.shared.contract.wire.base import Role, TaskKind, TaskState
from rlfleet.shared.contract.wire.evaluation import EvaluationReport, EvaluationResult
from rlfleet.shared.contract.wire.tasks import EvaluateTask
from rlfleet.shared.infra.storage import DirectoryStorage
from rlfleet.shared.run.config import parse_config

from .helpers import make_config


@pytest.fixture
def schedule(tmp_path, monkeypatch) -> EvaluationSchedule:
    monkeypatch.setattr(evaluation, "EVALUATION_WINDOW", 5)
    cfg = parse_config(make_config(), "test")
    table = TaskTable()
    return EvaluationSchedule(cfg, table, Membership(10.0), DirectoryStorage(tmp_path),
                              None, push=lambda rec: None)


def _evaluate(s: EvaluationSchedule, n: int) -> None:
    for i in range(n):
        task = EvaluateTask(task_id=s.tasks.new_id(TaskKind.EVALUATE), policy_version=i,
                            episodes=1, num_envs=1, seed=i)
        s.tasks.add(task, "collector-1")
        s.report(EvaluationReport(worker_id="collector-1", task_id=task.task_id,
                                  policy_version=i,
                                  deterministic={"returns": [float(i)], "lengths": [1]}),
                 env_steps=100 * i, train_iterations=i, wall_time=float(i),
                 record=lambda result: None)


def test_only_the_newest_evaluations_are_kept_and_pages_follow_a_cursor(schedule):
    _evaluate(schedule, 12)
    assert schedule.total == 12
    assert [e.seq for e in schedule.evaluations] == [8, 9, 10, 11, 12]
    page = schedule.page(0, 2)  # from the start: seven fell out of the window
    assert [e.seq for e in page.evaluations] == [8, 9]
    assert (page.missed, page.next, page.more, page.total) == (7, 9, True, 12)
    page = schedule.page(page.next, 100)
    assert [e.seq for e in page.evaluations] == [10, 11, 12]
    assert (page.missed, page.next, page.more) == (0, 12, False)
    page = schedule.page(12, 100)  # up to date: nothing, and the cursor stays
    assert (page.evaluations, page.next, page.missed, page.more) == ([], 12, 0, False)
    # the snapshot keeps the window and the count, not the history
    saved = schedule.snapshot()
    assert len(saved.evaluations) == 5 and saved.evaluations_total == 12


def test_a_restore_numbers_evaluations_of_a_snapshot_from_before_numbers(schedule):
    old = [EvaluationResult(task_id=f"evaluate-{i}", worker_id="c", policy_version=i,
                            env_steps=i, train_iterations=i, episodes=1, return_mean=1.0,
                            return_std=0.0, length_mean=1.0, wall_time=0.0).model_dump()
           for i in range(3)]
    for e in old:
        del e["seq"]
    schedule.restore(SavedEvaluations.model_validate({"next_eval_at": 0, "evaluations": old}))
    assert schedule.total == 3 and [e.seq for e in schedule.evaluations] == [1, 2, 3]
    _evaluate(schedule, 1)
    assert schedule.evaluations[-1].seq == 4


def test_only_the_newest_ended_tasks_are_remembered(monkeypatch):
    monkeypatch.setattr(tasks, "MAX_ENDED_TASKS", 3)
    table = TaskTable()
    live = table.add(EvaluateTask(task_id="evaluate-live", policy_version=0, episodes=1,
                                  num_envs=1, seed=0), "collector-1")
    ids = []
    for i in range(6):
        rec = table.add(EvaluateTask(task_id=table.new_id(TaskKind.EVALUATE),
                                     policy_version=i, episodes=1, num_envs=1, seed=i),
                        "collector-1")
        table.end(rec.task_id, TaskState.FINISHED)
        ids.append(rec.task_id)
    assert [r.task_id for r in table.all()] == [live.task_id, *ids[3:]]
    with pytest.raises(tasks.UnknownTask):
        table.get(ids[0])
    table.end(ids[-1], TaskState.FAILED)  # ending an ended task twice changes nothing
    assert len(table.all()) == 4


def test_only_the_newest_departed_workers_are_remembered(monkeypatch):
    monkeypatch.setattr(membership, "MAX_GONE_WORKERS", 2)
    now = [0.0]
    members = Membership(5.0, clock=lambda: now[0])
    alive, _ = members.register(Role.LEARNER, "http://127.0.0.1:1", None)
    for i in range(5):
        now[0] += 1
        w, _ = members.register(Role.COLLECTOR, f"http://127.0.0.1:{2 + i}", None)
        members.leave(w.worker_id)
    members.register(Role.COLLECTOR, "http://127.0.0.1:9", "collector-new")
    kept = {w.worker_id for w in members.all()}
    assert kept == {alive.worker_id, "collector-5", "collector-6", "collector-new"}


def test_a_snapshot_reads_the_window_while_reports_arrive(schedule):
    """The snapshot thread dumps the evaluation window while request threads append to it
    (iterating a deque that another thread appends to raises "deque mutated during
    iteration", which would cost the snapshot)."""
    schedule.evaluations = deque(maxlen=500)
    _evaluate(schedule, 500)
    done = threading.Event()
    errors: list[BaseException] = []

    def snapshots() -> None:
        try:
            while not done.is_set():
                schedule.snapshot()
        except RuntimeError as err:  # the failure this test is about
            errors.append(err)

    reader = threading.Thread(target=snapshots)
    reader.start()
    try:
        _evaluate(schedule, 300)
    finally:
        done.set()
        reader.join()
    assert not errors, errors
