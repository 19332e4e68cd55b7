"""The collector's pieces, each on its own: the inbox of pushed tasks, what acts (the random
warm-up, the policy refresh), the wait for a collect permit, the evaluator, the collect loop
and the service's report of how its tasks ended.

No coordinator and no torch: the coordinator is played by a recording client, the torch
loader by one that never finishes, and storage is a directory.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlfleet.collector.acting import Acting, PolicyRefresher, RandomPolicy
from rlfleet.collector.collecting import CollectLoop, wait_for_permit
from rlfleet.collector.counters import CollectorCounters
from rlfleet.collector.evaluator import EvaluationCrashed, Evaluator
from rlfleet.collector.inbox import TaskInbox
from rlfleet.collector.service import CollectorService
from rlfleet.shared.contract.codec import decode_arrays
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.evaluation import EvaluationReport
from rlfleet.shared.contract.wire.experience import (
    ChunkReport,
    ChunkReportResponse,
    CollectPermitResponse,
)
from rlfleet.shared.contract.wire.tasks import CollectTask, EvaluateTask, Opponent, TaskEnvelope
from rlfleet.shared.infra.http import HttpError
from rlfleet.shared.infra.storage import DirectoryStorage, StorageError, evaluated_blob
from rlfleet.shared.run.config import load_config

from .helpers import closed_port, wait_for

REPO = Path(__file__).resolve().parents[2]
DQN = load_config(REPO / "configs" / "cartpole-dqn.yaml")  # a random warm-up of 1000 steps
PPO = load_config(REPO / "configs" / "cartpole-ppo.yaml")  # none: its chunks need log-probs


def _opponent(name: str) -> Opponent:
    return Opponent(name=f"bot-{name}", kind="bot", bot=name)


def _evaluate(task_id: str = "evaluate-1", **fields: Any) -> EvaluateTask:
    return EvaluateTask(**{"task_id": task_id, "policy_version": 0, "episodes": 2,
                           "num_envs": 2, "seed": 0, "stochastic": False, **fields})


class _NoTorch:
    """A torch loader that never finishes: what acts stays what acts without torch."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.started = threading.Event()
        self.waits = 0

    def start(self) -> None:
        self.started.set()

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        self.start()
        return self.ready.wait(timeout)


class _Client:
    """The coordinator as a collector's client sees it: every request recorded, chunk reports
    answered (`stop` once `stop_after` chunks are in), permits answered as scripted."""

    def __init__(self, stop_after: int | None = None,
                 permit: CollectPermitResponse | HttpError | None = None) -> None:
        self.stop_after = stop_after
        self.permit = permit
        self.posts: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def post(self, path: str, body: Any = None, response: Any = None, **_: Any) -> Any:
        with self._lock:
            self.posts.append((path, body))
            chunks = sum(len(b.chunks) for p, b in self.posts if p == f"{API}/chunks")
        if path == f"{API}/chunks":
            return ChunkReportResponse(accepted=len(body.chunks), env_steps=0, throttle_s=0.0,
                                       stop=self.stop_after is not None
                                       and chunks >= self.stop_after)
        if path == f"{API}/permits/collect":
            if isinstance(self.permit, HttpError):
                raise self.permit
            return self.permit
        return None

    def bodies(self, path: str) -> list[Any]:
        with self._lock:
            return [b for p, b in self.posts if p == f"{API}{path}"]


class _Agent:
    """A registered worker's agent: its id, its client, and the tasks it ended."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.worker_id = "collector-1"
        self.info = None
        self.ended: list[tuple[str, str | None]] = []

    def end_task(self, task_id: str, error: str | None = None) -> None:
        self.ended.append((task_id, error))


# -- the inbox --------------------------------------------------------------------------------

def test_the_inbox_keeps_the_newest_collect_task_and_queues_only_a_new_tasks_opponents():
    inbox = TaskInbox()
    assert inbox.task_id() is None
    inbox.put_collect(CollectTask(task_id="collect-1", seed=0,
                                  opponents=[_opponent("random"), _opponent("perfect")]))
    inbox.put_collect(CollectTask(task_id="collect-1", seed=0,  # pushed again: no new games
                                  opponents=[_opponent("random"), _opponent("perfect")]))
    assert inbox.task_id() == "collect-1"
    assert [inbox.next_opponent().bot for _ in range(2)] == ["random", "perfect"]
    inbox.put_collect(CollectTask(task_id="collect-2", seed=1, opponents=[_opponent("a")]))
    inbox.on_answer(ChunkReportResponse(accepted=1, env_steps=0, throttle_s=0.0, stop=False,
                                        opponents=[_opponent("b")]))
    assert inbox.task_id() == "collect-2"
    assert [inbox.next_opponent().bot for _ in range(3)] == ["a", "b", "b"]  # then the last


def test_the_inbox_names_the_learning_policy_until_an_opponent_is_assigned():
    assert TaskInbox().next_opponent().kind == "main"


def test_evaluations_wait_in_the_order_they_came():
    inbox = TaskInbox()
    assert not inbox.evaluations_waiting() and inbox.next_evaluation() is None
    for i in range(3):
        inbox.put_evaluation(_evaluate(f"evaluate-{i}"))
    assert inbox.evaluations_waiting()
    assert [inbox.next_evaluation().task_id for _ in range(3)] == [
        "evaluate-0", "evaluate-1", "evaluate-2"]
    assert inbox.next_evaluation() is None


# -- what acts --------------------------------------------------------------------------------

def _acting(cfg, tmp_path: Path, torch: _NoTorch | None = None) -> Acting:
    counters = CollectorCounters()
    return Acting(cfg, 0, DirectoryStorage(tmp_path), torch or _NoTorch(),
                  PolicyRefresher(counters), counters)


def test_dqn_acts_at_random_until_the_run_or_this_collector_is_past_the_warm_up(tmp_path):
    acting = _acting(DQN, tmp_path)
    assert isinstance(acting.policy, RandomPolicy) and not acting.real
    assert acting.warmup_steps == 1000
    assert not acting.wants_real(evaluations_waiting=False, run_env_steps=999)
    assert acting.wants_real(evaluations_waiting=False, run_env_steps=1000)
    assert acting.wants_real(evaluations_waiting=True, run_env_steps=0)  # they need it
    acting.acted(600)
    acting.acted(400)
    assert acting.counters.random_steps == 1000
    assert acting.wants_real(evaluations_waiting=False, run_env_steps=0)


def test_once_torch_is_there_the_run_policy_is_wanted_whatever_the_warm_up(tmp_path):
    torch = _NoTorch()
    torch.ready.set()
    acting = _acting(DQN, tmp_path, torch)
    assert acting.policy is None  # no random warm-up: the real policy is at hand
    assert acting.wants_real(evaluations_waiting=False, run_env_steps=0)


def test_ppo_waits_for_torch_and_its_policy(tmp_path):
    acting = _acting(PPO, tmp_path)
    assert acting.policy is None and acting.warmup_steps == 0
    assert acting.wants_real(evaluations_waiting=False, run_env_steps=0)
    assert not acting.make_real(timeout=0.01)  # torch still loading: ask again later
    assert not acting.real
    acting.refresh(force=True)  # nothing to refresh yet: no weights, no error
    acting.acted(100)
    assert acting.counters.random_steps == 0  # nothing acted at random


class _Weights:
    """A weight source whose next answers are scripted: an error, None or a version."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.forced: list[bool] = []

    def poll(self, current_version: int, force: bool = False) -> Any:
        self.forced.append(force)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class _Versioned:
    def __init__(self) -> None:
        self.version = -1

    def load_policy(self, version: int, state: dict) -> None:
        self.version = version


def test_the_refresher_rides_out_an_outage_with_one_warning_and_counts_each_load(caplog):
    counters = CollectorCounters()
    refresher = PolicyRefresher(counters)
    policy = _Versioned()
    weights = _Weights([StorageError("down"), StorageError("down"), None, (4, {}), None])
    with caplog.at_level(logging.INFO, logger="rlfleet.collector"):
        for force in (False, True, False, False, False):
            refresher.refresh(policy, weights, force=force)
    assert caplog.text.count("cannot check for a newer policy") == 1
    assert caplog.text.count("policy checks resume") == 1
    assert weights.forced == [False, True, False, False, False]
    assert policy.version == 4
    assert (counters.policy_version, counters.policy_loads) == (4, 1)


# -- the wait for a collect permit ------------------------------------------------------------

class _Adder:
    def __init__(self, flushed: bool = True, throttled: bool = True) -> None:
        self.flushed = flushed
        self.throttle = threading.Event()
        if throttled:
            self.throttle.set()
        self.halted = False

    def flush(self, timeout: float = 10.0) -> bool:
        return self.flushed

    def halt(self) -> None:
        self.halted = True


def _permit(adder: _Adder, permit: Any = None) -> tuple[bool, _Client]:
    client = _Client(permit=permit)
    closing = threading.Event()
    closing.set()  # the pause after a failed request returns at once
    return wait_for_permit(_Agent(client), adder, closing), client


def test_a_permit_is_asked_only_once_every_chunk_is_answered_and_the_throttle_stays():
    granted, client = _permit(_Adder(flushed=False))
    assert granted is False and not client.posts  # look at closing and evaluations first
    granted, client = _permit(_Adder(throttled=False))
    assert granted is True and not client.posts  # the last answer lifted the throttle


def test_a_permit_answer_grants_or_stops(caplog):
    adder = _Adder()
    granted, client = _permit(adder, CollectPermitResponse(granted=True, stop=False))
    assert granted is True and not adder.halted
    (body,) = client.bodies("/permits/collect")
    assert body.worker_id == "collector-1"
    granted, _ = _permit(adder, CollectPermitResponse(granted=False, stop=True))
    assert granted is False and adder.halted
    with caplog.at_level(logging.WARNING, logger="rlfleet.collector"):
        granted, _ = _permit(_Adder(), HttpError("unreachable"))
    assert granted is False and "permit request failed" in caplog.text


# -- the evaluator ----------------------------------------------------------------------------

class _Greedy:
    """A published policy that always pushes left, or raises when it acts."""

    on_policy = False

    def __init__(self, version: int = 3, fail: bool = False) -> None:
        self.version = version
        self.fail = fail
        self.acted = 0

    def act_eval(self, obs: np.ndarray, deterministic: bool = True, **_: Any) -> np.ndarray:
        if self.fail:
            raise RuntimeError("the policy broke")
        self.acted += 1
        return np.zeros(obs.shape[0], dtype=np.int64)

    def policy_state(self) -> dict:
        return {}


class _Acting:
    """The run's policy, already acting; `for_evaluation` as `Acting`'s, without torch."""

    real = True

    def __init__(self, policy: _Greedy) -> None:
        self.policy = policy
        self.asked: list[int] = []

    def for_evaluation(self, version: int) -> _Greedy:
        self.asked.append(version)
        return self.policy


def _evaluator(tmp_path: Path, client: _Client) -> tuple[Evaluator, _Agent, DirectoryStorage]:
    agent = _Agent(client)
    storage = DirectoryStorage(tmp_path)
    return Evaluator(DQN, storage, agent, CollectorCounters()), agent, storage


def test_an_evaluation_reports_its_episodes_and_stores_the_evaluated_weights(tmp_path):
    client = _Client()
    evaluator, _, storage = _evaluator(tmp_path, client)
    acting = _Acting(_Greedy(version=3))
    try:
        evaluator.run(_evaluate("evaluate-5", policy_version=2, episodes=3, stochastic=True),
                      acting)
    finally:
        evaluator.close()
    assert acting.asked == [2]
    (report,) = client.bodies("/evaluations")
    assert isinstance(report, EvaluationReport)
    assert report.task_id == "evaluate-5" and report.worker_id == "collector-1"
    assert report.policy_version == 3 and report.video is None
    assert len(report.deterministic.returns) == 3 and len(report.stochastic.returns) == 3
    assert all(r == length for r, length in zip(report.deterministic.returns,
                                                report.deterministic.lengths, strict=True))
    _, meta = decode_arrays(storage.get_blob(evaluated_blob("evaluate-5")))
    assert meta["policy_version"] == "3"
    assert evaluator.counters.evaluations == 1


def test_an_evaluation_that_cannot_be_reported_is_a_warning_not_a_crash(tmp_path, caplog):
    class Unreachable(_Client):
        def post(self, path: str, body: Any = None, response: Any = None, **kw: Any) -> Any:
            raise HttpError("coordinator down")

    evaluator, _, _ = _evaluator(tmp_path, Unreachable())
    try:
        with caplog.at_level(logging.WARNING, logger="rlfleet.collector"):
            evaluator.run(_evaluate("evaluate-6"), _Acting(_Greedy()))
    finally:
        evaluator.close()
    assert "could not report evaluation evaluate-6" in caplog.text
    assert evaluator.counters.evaluations == 1


def test_an_evaluation_that_raises_is_that_evaluations_crash(tmp_path):
    client = _Client()
    evaluator, _, _ = _evaluator(tmp_path, client)
    try:
        with pytest.raises(EvaluationCrashed) as crashed:
            evaluator.run(_evaluate("evaluate-7"), _Acting(_Greedy(fail=True)))
    finally:
        evaluator.close()
    assert crashed.value.task_id == "evaluate-7"
    assert isinstance(crashed.value.__cause__, RuntimeError)
    assert str(crashed.value.__cause__) == "the policy broke"
    assert not client.posts and evaluator.counters.evaluations == 0


def test_the_evaluator_keeps_its_envs_while_tasks_ask_for_as_many(tmp_path, monkeypatch):
    import rlfleet.collector.evaluator as module

    made: list[int] = []
    real = module.make_vector_env

    def counted(env, num_envs, seed):
        made.append(num_envs)
        return real(env, num_envs, seed)

    monkeypatch.setattr(module, "make_vector_env", counted)
    evaluator, _, _ = _evaluator(tmp_path, _Client())
    acting = _Acting(_Greedy())
    try:
        for task_id, num_envs in (("evaluate-1", 2), ("evaluate-2", 2), ("evaluate-3", 3)):
            evaluator.run(_evaluate(task_id, num_envs=num_envs), acting)
    finally:
        evaluator.close()
    assert made == [2, 3]


# -- the collect loop -------------------------------------------------------------------------

def _loop(tmp_path: Path, client: _Client, torch: _NoTorch, inbox: TaskInbox | None = None
          ) -> tuple[CollectLoop, DirectoryStorage, threading.Event]:
    inbox = inbox or TaskInbox()
    task = CollectTask(task_id="collect-1", seed=0)
    inbox.put_collect(task)
    storage = DirectoryStorage(tmp_path)
    counters = CollectorCounters()
    acting = Acting(DQN, task.seed, storage, torch, PolicyRefresher(counters),
                    counters)
    closing = threading.Event()
    cfg = DQN.with_overrides(collector=DQN.collector.model_copy(update={"chunk_size": 64}))
    loop = CollectLoop(cfg, task, storage, _Agent(client), inbox, acting,
                       counters, closing)
    return loop, storage, closing


def _run(loop: CollectLoop) -> threading.Thread:
    thread = threading.Thread(target=loop.run, name="collect-test", daemon=True)
    thread.start()
    return thread


def test_the_loop_acts_at_random_while_torch_loads_and_ends_when_the_coordinator_says_stop(
        tmp_path):
    client = _Client(stop_after=3)
    torch = _NoTorch()
    loop, storage, _ = _loop(tmp_path, client, torch)
    thread = _run(loop)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the loop went on after the coordinator said stop"
    counters = loop.counters
    reports: list[ChunkReport] = client.bodies("/chunks")
    chunks = [meta for report in reports for meta in report.chunks]
    assert len(chunks) >= 3 and {r.task_id for r in reports} == {"collect-1"}
    assert {meta.length for meta in chunks} == {64}  # the run config's collector.chunk_size
    assert counters.chunks_reported == loop.adder.chunks_reported == len(chunks)
    assert set(storage.list_chunks()) == {meta.chunk_id for meta in chunks}
    assert {meta.policy_version for meta in chunks} == {-1}  # no published policy acted
    assert counters.random_steps == counters.env_steps == 64 * counters.chunks_written
    assert torch.started.is_set()  # once the first chunk was in


def test_a_waiting_evaluation_ends_the_random_warm_up_and_closing_ends_the_loop(tmp_path):
    client = _Client()
    torch = _NoTorch()
    inbox = TaskInbox()
    inbox.put_evaluation(_evaluate())
    loop, storage, closing = _loop(tmp_path, client, torch, inbox)
    thread = _run(loop)
    try:
        wait_for(lambda: torch.waits >= 3, what="the loop waiting for torch")
        assert loop.counters.env_steps == 0 and not storage.list_chunks()
        assert inbox.evaluations_waiting()  # it waits for the run's policy
    finally:
        closing.set()
        thread.join(timeout=30)
    assert not thread.is_alive(), "closing did not end the loop"


# -- the service ------------------------------------------------------------------------------

@pytest.fixture
def service(monkeypatch):
    nowhere = f"http://127.0.0.1:{closed_port()}"
    service = CollectorService(nowhere, nowhere)  # never started: no registration
    ended: list[tuple[str, str | None]] = []
    failed: list[tuple[BaseException | None, str]] = []
    monkeypatch.setattr(service.agent, "end_task",
                        lambda task_id, error=None: ended.append((task_id, error)))
    monkeypatch.setattr(service, "fail", lambda err=None, where="": failed.append((err, where)))
    service.ended, service.failed = ended, failed
    service.inbox.put_collect(CollectTask(task_id="collect-1", seed=0))
    try:
        yield service
    finally:
        service.close()


def _crash_with(service: CollectorService, monkeypatch, err: BaseException) -> None:
    def run() -> None:
        raise err

    monkeypatch.setattr(service, "_run", run)
    service._run_guarded()


def test_a_collect_task_that_ends_is_reported_finished(service, monkeypatch):
    monkeypatch.setattr(service, "_run", lambda: None)
    service._run_guarded()
    assert service.ended == [("collect-1", None)] and not service.failed


def test_a_crash_in_collection_fails_the_collect_task_and_the_process(service, monkeypatch):
    err = RuntimeError("the env broke")
    _crash_with(service, monkeypatch, err)
    assert service.ended == [("collect-1", "RuntimeError: the env broke")]
    assert service.failed == [(err, "collection")]
    assert service.status()["error"] == "RuntimeError: the env broke"


def test_a_crash_in_an_evaluation_fails_that_evaluation_first(service, monkeypatch):
    cause = RuntimeError("the env broke")
    crash = EvaluationCrashed("evaluate-7")
    crash.__cause__ = cause
    _crash_with(service, monkeypatch, crash)
    assert service.ended == [
        ("evaluate-7", "evaluation crashed: RuntimeError: the env broke"),
        ("collect-1", "collector crashed in evaluation evaluate-7: RuntimeError: the env broke")]
    assert service.failed == [(cause, "evaluation evaluate-7")]


def test_the_service_takes_collect_and_evaluate_tasks_into_its_inbox(service, monkeypatch):
    started: list[bool] = []
    monkeypatch.setattr(service, "_start_loop", lambda: started.append(True))
    answer = service.accept(TaskEnvelope(task=CollectTask(task_id="collect-2", seed=0)))
    assert answer.accepted and service.inbox.task_id() == "collect-2" and started
    answer = service.accept(TaskEnvelope(task=_evaluate("evaluate-9")))
    assert answer.accepted and service.inbox.next_evaluation().task_id == "evaluate-9"
    status = service.status()
    assert status["task_id"] == "collect-2" and status["env_steps"] == 0
    assert status["policy_version"] == -1 and status["chunks_held"] == 0
