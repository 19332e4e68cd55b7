"""The learner service's parts, each on its own with fakes around it: the timers' arithmetic
(`learner/observe/timers.py`), the group session (`learner/group/session.py`), the built-in
hooks (publishing, checkpoints, reports) and the loops themselves (`learner/loops/`). Whole
learners against a real coordinator are the integration and chaos suites' business."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlfleet.learner.group import session
from rlfleet.learner.group.member import GroupError
from rlfleet.learner.group.session import GroupSession
from rlfleet.learner.loops import off_policy, on_policy
from rlfleet.learner.loops.off_policy import OffPolicyLoop
from rlfleet.learner.loops.on_policy import OnPolicyLoop
from rlfleet.learner.observe.timers import LearnerTimers, UpdateRate
from rlfleet.learner.output.checkpointing import Checkpointing
from rlfleet.learner.output.checkpoints import CheckpointStore
from rlfleet.learner.output.publisher import PublishConflict
from rlfleet.learner.output.publishing import Publishing
from rlfleet.learner.output.reporting import Reports, learning_rate
from rlfleet.learner.training import Progress, Training
from rlfleet.shared.algos.base import LearnOutput
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.group import GroupAssignment
from rlfleet.shared.contract.wire.membership import HeartbeatResponse
from rlfleet.shared.contract.wire.sampling import Consumed, LearnInfo, LearnInfoResponse
from rlfleet.shared.infra.http import HttpError
from rlfleet.shared.infra.storage import StorageError
from rlfleet.shared.infra.storage.directory import DirectoryStorage
from rlfleet.shared.run.config import parse_config

from .helpers import buffer_config, make_config

# -- fakes -----------------------------------------------------------------------------------


class FakeClient:
    """Answers POSTs by path from `answers` (a value, an exception to raise, or a callable of
    the body); records every body."""

    base_url = "http://coordinator.invalid"

    def __init__(self, **answers: Any) -> None:
        self.answers: dict[str, Any] = answers
        self.sent: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def post(self, path: str, body: Any = None, response_model: Any = None, **_: Any) -> Any:
        with self._lock:
            self.sent.append((path, body))
        answer = self.answers[path.rsplit("/", 1)[-1]]
        if callable(answer) and not isinstance(answer, type):
            answer = answer(body)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def bodies(self, what: str) -> list[Any]:
        with self._lock:
            return [b for p, b in self.sent if p.endswith(what)]


def fake_agent(**answers: Any) -> SimpleNamespace:
    return SimpleNamespace(worker_id="l1", client=FakeClient(**answers))


class FakePublisher:
    def __init__(self, version: int = -1) -> None:
        self.version = version
        self.submitted: list[int] = []
        self.flushes = 0
        self.conflict = False
        self.routes: list[Any] = []
        self.seconds = 0.0

    def submit(self, state: dict, train_iterations: int) -> None:
        if self.conflict:
            raise PublishConflict("another learner published version 3")
        self.submitted.append(train_iterations)

    def flush(self) -> None:
        self.flushes += 1

    def attach(self, storage: Any, version: int) -> None:
        self.version = version

    def due(self, min_interval_s: float) -> bool:
        return True

    def use(self, sink: Any) -> None:
        self.routes.append(sink)


@dataclass
class FakeReducer:
    seconds: float = 0.0


class FakeMember:
    store_addr = "127.0.0.1:29500"

    def __init__(self) -> None:
        self.reducer: FakeReducer | None = None
        self.formed: list[int] = []
        self.left = 0
        self.closed = False

    def form(self, assignment: GroupAssignment) -> FakeReducer | None:
        self.formed.append(assignment.generation)
        self.reducer = FakeReducer() if assignment.world_size > 1 else None
        return self.reducer

    def broadcast_state(self, state: Any, version: int) -> tuple[Any, int]:
        return state, version

    def leave(self) -> None:
        self.left += 1
        self.reducer = None

    def close(self) -> None:
        self.closed = True


class CountingPolicy:
    """Learns by counting; `on_learn` may end the run or the generation mid-loop."""

    on_policy = False

    def __init__(self) -> None:
        self.train_iterations = 0
        self.on_learn: Callable[[int], None] = lambda n: None

    def learn(self, batch: Any, weights: Any = None) -> LearnOutput:
        self.train_iterations += 1
        self.on_learn(self.train_iterations)
        return LearnOutput({"loss": 0.5})

    def policy_state(self) -> dict[str, torch.Tensor]:
        return {"w": torch.tensor([float(self.train_iterations)])}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"w": torch.tensor([float(self.train_iterations)]),
                "train_iterations": torch.tensor(self.train_iterations)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.train_iterations = int(state["train_iterations"])


class ReducingPolicy(CountingPolicy):
    """A `DataParallel` stand-in."""

    def set_reducer(self, reducer: Any) -> None:
        self.reducer = reducer


def assignment(generation: int = 1, rank: int | None = 0, world_size: int = 1,
               publisher: bool = True) -> GroupAssignment:
    return GroupAssignment(generation=generation, epoch="e", rank=rank, world_size=world_size,
                           store_addr="127.0.0.1:29500", ranks=["l1"], publisher=publisher)


def make_session(agent: Any, publisher: Any = None,
                 closing: threading.Event | None = None) -> GroupSession:
    s = GroupSession(agent, publisher or FakePublisher(), closing or threading.Event())
    s.open(FakeMember())  # type: ignore[arg-type]
    return s


def make_training(tmp_path, policy: Any = None, *, answers: dict | None = None,
                  learner: dict | None = None, every: int = 10,
                  assigned: GroupAssignment | None = None) -> Training:
    cfg = parse_config(make_config(learner=learner or {},
                                   checkpoint={"every_train_iterations": every}))
    storage = DirectoryStorage(tmp_path / "storage")
    agent = fake_agent(**{"learn-info": LearnInfoResponse(stop=False), **(answers or {})})
    publisher = FakePublisher()
    s = make_session(agent, publisher)
    s.assignment = assigned or assignment()
    return Training(cfg, policy or CountingPolicy(), storage, str(tmp_path / "storage"), 7,
                    agent, threading.Event(), publisher, s, LearnerTimers(), Progress(),
                    CheckpointStore(storage, "ckpt", 3))


# -- timers ----------------------------------------------------------------------------------

def test_per_iteration_is_milliseconds_per_train_iteration_since_the_last_report():
    t = LearnerTimers()
    assert t.per_iteration(0, 0.0, 0.0) == {}  # no iteration yet: nothing to divide by
    t.wait_s, t.update_s, t.publish_s = 0.2, 1.0, 0.1
    got = t.per_iteration(100, chunk_fetch_s=0.05, allreduce_s=0.3)
    assert got == pytest.approx({"sample_wait_ms": 2.0, "update_ms": 9.0, "publish_ms": 1.0,
                                 "chunk_fetch_ms": 0.5, "allreduce_ms": 3.0})
    # the next report counts only what came after this one
    t.wait_s, t.update_s = 0.6, 1.5
    got = t.per_iteration(300, chunk_fetch_s=0.05, allreduce_s=0.5)
    assert got == pytest.approx({"sample_wait_ms": 2.0, "update_ms": 2.5, "publish_ms": 0.0,
                                 "chunk_fetch_ms": 0.0, "allreduce_ms": 1.0})
    assert t.per_iteration(300, 1.0, 1.0) == {}  # no iteration since: nothing reported


def test_a_restored_learner_counts_iterations_from_its_checkpoint():
    t = LearnerTimers()
    t.mark(5000)
    t.update_s = 0.01
    assert t.per_iteration(5010, 0.0, 0.0)["update_ms"] == pytest.approx(1.0)


def test_update_never_goes_below_zero_when_publishing_outside_updates():
    t = LearnerTimers()
    t.update_s, t.publish_s = 0.1, 0.4  # versions published while forming a group
    assert t.per_iteration(10, 0.0, 0.0)["update_ms"] == 0.0


def test_count_update_adds_wall_and_thread_time_and_utilisation_follows():
    t = LearnerTimers()
    assert t.utilisation() is None
    t1, c1 = time.perf_counter(), time.thread_time()
    sum(i * i for i in range(200_000))  # CPU work on this thread
    t.count_update(t1, c1)
    assert t.update_s > 0 and 0 < t.update_cpu_s <= t.update_s + 0.01
    t.wait_s = t.update_s
    assert t.utilisation() == 0.5
    status = t.status(publish_thread_s=1.23456)
    assert status["publish_thread_s"] == 1.235 and status["update_s"] == round(t.update_s, 3)
    assert set(status) == {"update_s", "update_cpu_s", "wait_s", "publish_s",
                           "publish_thread_s"}


def test_update_rate_is_over_the_last_window_of_asks():
    now = [0.0]
    rate = UpdateRate(window_s=10.0, clock=lambda: now[0])
    assert rate(0) == 0.0  # one sample: no rate yet
    now[0] = 5.0
    assert rate(500) == pytest.approx(100.0)
    now[0] = 14.0  # the sample at 0 s has left the window
    assert rate(1400) == pytest.approx(100.0)
    now[0] = 30.0  # both earlier samples have left it: nothing to compare against
    assert rate(1400) == 0.0


# -- the group session -----------------------------------------------------------------------

def test_a_standby_waits_and_leaves_the_generation_it_watched(monkeypatch):
    monkeypatch.setattr(session, "STANDBY_POLL_S", 0.01)
    answers = iter([assignment(3, rank=None, world_size=2, publisher=False),
                    assignment(3, rank=None, world_size=2, publisher=False),
                    assignment(4, rank=1, world_size=3, publisher=False)])
    s = make_session(fake_agent(**{"learner-group": lambda body: next(answers)}))
    got = s.sync(broken="all-reduce failed")
    assert (got.generation, got.rank) == (4, 1)
    sent = s.agent.client.bodies("learner-group")
    assert [(b.generation, b.broken) for b in sent] == [(None, "all-reduce failed"),
                                                         (3, None), (3, None)]
    assert s.assignment.generation == 3 and s.member.left == 1  # standby in 3, once


def test_a_sync_that_fails_is_asked_again_and_closing_ends_it(monkeypatch):
    monkeypatch.setattr(session, "SYNC_RETRY_S", 0.01)
    closing = threading.Event()
    agent = fake_agent()

    def refuse(body: Any) -> HttpError:
        if len(agent.client.sent) == 3:
            closing.set()  # the learner is told to stop while the coordinator is away
        return HttpError("connection refused")

    agent.client.answers["learner-group"] = refuse
    s = make_session(agent, closing=closing)
    assert s.sync(None) is None
    assert len(agent.client.bodies("learner-group")) == 3


def test_only_a_newer_generation_from_a_heartbeat_moves_the_learner_on():
    s = make_session(fake_agent())
    hb = dict(stop=False, policy_version=None, env_steps=0)
    s.on_heartbeat(HeartbeatResponse(group_generation=9, **hb))
    assert not s.generation_moved()  # no generation of its own yet
    s.assignment = assignment(5)
    assert s.generation_moved()
    s.on_heartbeat(HeartbeatResponse(group_generation=4, **hb))
    assert not s.generation_moved()
    s.on_heartbeat(HeartbeatResponse(group_generation=None, **hb))
    assert s.generation_seen == 4  # a heartbeat without a generation changes nothing


def test_forming_adopts_the_newest_version_and_counts_collectives_across_generations(tmp_path):
    storage = DirectoryStorage(tmp_path)
    storage.put_weights(0, b"x")
    storage.put_weights(1, b"y")
    publisher = FakePublisher(version=-1)
    s = make_session(fake_agent(), publisher)
    s.form(assignment(1, world_size=2), ReducingPolicy(), storage)
    assert publisher.version == 1 and s.formations == 1 and publisher.flushes == 1
    s.member.reducer.seconds = 0.25
    s.form(assignment(2), ReducingPolicy(), storage)
    s.member.reducer = FakeReducer(seconds=0.5)
    assert s.allreduce_seconds() == 0.75
    status = s.status()
    assert status["allreduce_s"] == 0.75 and status["formations"] == 2
    assert s.heartbeat_status() == {"group_generation": 2.0, "group_rank": 0.0,
                                    "group_world_size": 1.0}


def test_a_policy_that_cannot_reduce_cannot_join_a_group_of_several(tmp_path):
    s = make_session(fake_agent())
    with pytest.raises(ConfigError, match="not DataParallel"):
        s.form(assignment(1, world_size=2), CountingPolicy(), DirectoryStorage(tmp_path))
    s.form(assignment(1, world_size=1), CountingPolicy(), DirectoryStorage(tmp_path))


def test_a_broken_generation_is_reported_with_the_next_sync_and_formed_again(tmp_path):
    answers = iter([assignment(1), assignment(1), assignment(2)])
    s = make_session(fake_agent(**{"learner-group": lambda body: next(answers)}))
    formed: list[int] = []
    results = iter([GroupError("all-reduce failed: peer gone"), False, True])

    def train() -> bool:
        r = next(results)
        if isinstance(r, BaseException):
            raise r
        return r

    s.run(CountingPolicy(), DirectoryStorage(tmp_path), lambda a: formed.append(a.generation),
          train)
    sent = s.agent.client.bodies("learner-group")
    assert [b.broken for b in sent] == [None, "all-reduce failed: peer gone", None]
    # generation 1 is formed again after it broke; generation 2 is formed once
    assert formed == [1, 1, 2] and s.member.formed == [1, 1, 2]


# -- the built-in hooks ----------------------------------------------------------------------

def checkpointing(t: Training) -> Checkpointing:
    hook = Checkpointing(t.checkpoints, t.cfg.checkpoint.every_train_iterations, t.session,
                         t.publisher, t.timers, t.progress)
    t.hooks.add(hook)
    return hook


def test_checkpoints_are_saved_every_interval_by_the_publisher_only(tmp_path):
    t = make_training(tmp_path, every=10)
    hook = checkpointing(t)
    t.policy.train_iterations = 9
    t.hooks.after_round()
    assert t.checkpoints.entries == []
    t.policy.train_iterations = 10
    t.hooks.after_round()
    hook.save(t.ctx, force=True)  # nothing new since: not saved twice
    assert [e.train_iterations for e in t.checkpoints.entries] == [10]
    assert t.progress.last_checkpoint == 10 and t.timers.checkpoint_s > 0
    t.policy.train_iterations = 13
    t.hooks.after_run()  # the end of the run
    t.session.assignment = assignment(2, rank=1, publisher=False)
    t.policy.train_iterations = 40
    hook.save(t.ctx, force=True)
    assert [e.train_iterations for e in t.checkpoints.entries] == [10, 13]


def test_a_checkpoint_storage_could_not_take_is_tried_at_the_next_interval(tmp_path, caplog):
    t = make_training(tmp_path, every=10)
    checkpointing(t)

    def out(*_: Any) -> None:
        raise StorageError("redis is restarting")

    t.checkpoints.save = out  # type: ignore[method-assign]
    t.policy.train_iterations = 10
    t.hooks.after_round()
    assert t.progress.last_checkpoint == 0 and "not saved" in caplog.text


def test_a_crashing_learner_saves_what_it_learned_unless_the_weights_went_bad(tmp_path):
    t = make_training(tmp_path, every=1000)
    checkpointing(t)
    t.policy.train_iterations = 7
    t.hooks.after_run(crashed=RuntimeError("the loss went NaN"))
    assert [e.train_iterations for e in t.checkpoints.entries] == [7]

    class NaNPolicy(CountingPolicy):
        def state_dict(self) -> dict[str, torch.Tensor]:
            return {"w": torch.tensor([float("nan")]), "train_iterations": torch.tensor(9)}

    t = make_training(tmp_path / "2", NaNPolicy(), every=1000)
    checkpointing(t)
    t.policy.train_iterations = 9
    t.hooks.after_run(crashed=RuntimeError("the loss went NaN"))
    assert t.checkpoints.entries == []


def test_a_resumed_learner_continues_from_its_checkpoint_after_the_newest_version(tmp_path):
    t = make_training(tmp_path)
    t.policy.train_iterations = 120
    t.checkpoints.save(t.policy.state_dict(), 120, 4)
    t.storage.put_weights(6, b"w")
    t.policy.train_iterations = 0
    t.resume()
    assert t.policy.train_iterations == 120 and t.publisher.version == 6
    assert (t.progress.resumed_from, t.progress.last_checkpoint) == (120, 120)
    t.policy.train_iterations, t.timers.update_s = 130, 0.01
    assert t.timers_ms()["update_ms"] == pytest.approx(1.0)  # 10 iterations, not 130


def test_checkpoints_carry_the_hooks_state_and_a_resume_gives_it_back(tmp_path):
    class Seen:
        def __init__(self) -> None:
            self.updates = 0

        def after_iter(self, ctx: Any) -> None:
            self.updates += 1

        def state_dict(self) -> dict:
            return {"updates": self.updates}

        def load_state_dict(self, state: dict) -> None:
            self.updates = state["updates"]

    t = make_training(tmp_path, every=2)
    checkpointing(t)
    seen = Seen()
    t.hooks.add_user_hook(seen, 0, "learner.hooks[0]")
    for _ in range(2):
        t.policy.learn({})
        t.hooks.after_iter(LearnOutput({}))
    t.hooks.after_round()
    t2 = make_training(tmp_path)
    again = Seen()
    t2.hooks.add_user_hook(again, 0, "learner.hooks[0]")
    t2.resume()
    assert again.updates == 2 and t2.policy.train_iterations == 2


def test_publishing_counts_its_time_and_a_conflict_ends_the_generation(tmp_path):
    t = make_training(tmp_path)
    hook = Publishing(t.publisher, t.session, t.timers, every=1)
    t.policy.train_iterations = 3
    hook.publish(t.ctx, wait=True)
    assert t.publisher.submitted == [3] and t.timers.publish_s > 0
    t.publisher.conflict = True
    with pytest.raises(GroupError, match="another learner"):
        hook.publish(t.ctx, wait=False)


def test_an_undelivered_report_gives_its_consumed_chunks_back(tmp_path):
    t = make_training(tmp_path, answers={"learn-info": HttpError("timed out")})
    t.progress.feeder = SimpleNamespace(given=[], give_back=lambda c: t.progress.feeder.given
                                        .extend(c))
    consumed = [Consumed(buffer="q", chunk_ids=["a", "b"])]
    assert Reports(t).send_now(consumed) is False
    assert t.progress.feeder.given == consumed


def test_a_report_marks_the_best_checkpoint_and_says_when_the_run_is_over(tmp_path):
    t = make_training(tmp_path, answers={
        "learn-info": LearnInfoResponse(stop=True, best_policy_version=2)})
    reports = Reports(t)
    t.policy.train_iterations = 10
    t.checkpoints.save(t.policy.state_dict(), 10, 1)
    t.window.add({"loss": torch.tensor(1.0)})
    reports.take_metrics()
    assert reports.send_now() and t.run_over.is_set()
    assert t.checkpoints.best == "ckpt-000000000010"
    (body,) = t.agent.client.bodies("learn-info")
    assert (body.train_iterations, body.metrics, body.consumed) == (10, {"loss": 1.0}, [])
    assert body.metric_counts == {"loss": 1}
    reports.send_now()  # no update since: the same loss is not reported (and weighed) twice
    assert t.agent.client.bodies("learn-info")[-1].metrics == {}
    assert t.progress.metrics == {"loss": 1.0}  # /status still shows the last means


def test_a_report_snapshot_takes_the_dataset_scores_once(tmp_path):
    t = make_training(tmp_path)
    reports = Reports(t)
    t.policy.train_iterations = 4
    t.outbox.dataset_eval = {"action_accuracy": 0.75}
    t.window.add({"loss": 2.0})
    reports.take_metrics()
    build = reports.snapshot()
    t.window.add({"loss": 3.0})  # the training thread moves on: the snapshot does not
    reports.take_metrics()
    info = build()
    assert isinstance(info, LearnInfo) and info.metrics == {"loss": 2.0}
    assert info.dataset_eval == {"action_accuracy": 0.75} and t.outbox.dataset_eval == {}
    assert reports.snapshot()().dataset_eval == {}


def test_reports_carry_the_learning_rate_of_an_optimized_policy(tmp_path):
    assert learning_rate(CountingPolicy()) == {}

    class WithOptimizer(CountingPolicy):
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.01)

    assert learning_rate(WithOptimizer()) == pytest.approx({"learning_rate": 0.01})
    t = make_training(tmp_path)
    t.policy = WithOptimizer()
    t.window.add({"loss": 1})
    Reports(t).take_metrics()
    assert t.progress.metrics == pytest.approx({"loss": 1.0, "learning_rate": 0.01})


# -- the off-policy loop ---------------------------------------------------------------------

@dataclass
class FakeFeed:
    """Hands out `responses` (lists of batches), then ends the generation."""

    responses: list[list[Any]]
    broken: str | None = None
    fetch_s: float = 0.0
    dropped_responses: int = 0
    stop_run: threading.Event = field(default_factory=threading.Event)
    group_ended: threading.Event = field(default_factory=threading.Event)
    closed: bool = False

    def get(self, timeout: float) -> list[Any] | None:
        if not self.responses:
            self.group_ended.set()
            return None
        return self.responses.pop(0)

    def take_moments(self) -> list[dict]:
        return []

    def weight_sink(self, storage: Any) -> str:
        return "sink"

    def close(self, wait: bool = True) -> None:
        self.closed = True


def batch() -> SimpleNamespace:
    return SimpleNamespace(data={}, weights=None, item_refs=[], samples=[])


def test_the_off_policy_loop_learns_publishes_and_ends_with_the_generation(tmp_path,
                                                                          monkeypatch):
    feed = FakeFeed([[batch() for _ in range(3)] for _ in range(2)])
    monkeypatch.setattr(off_policy, "open_feed", lambda t: feed)
    t = make_training(tmp_path, learner={"publish_every": 2, "publish_min_interval_s": 0.0,
                                         "data_process": False})
    loop = OffPolicyLoop(t)
    loop.formed(t.session.assignment)
    assert t.publisher.submitted == [0]  # the publisher announces the generation
    assert loop.run_generation() is False  # the generation ended, not the run
    assert t.policy.train_iterations == 6 and t.progress.train_iterations == 6
    assert t.publisher.submitted == [0, 2, 4, 6] and t.progress.prefetcher is feed
    assert feed.closed and t.publisher.routes == ["sink", None]
    assert t.timers.update_s > 0 and t.timers.wait_s >= 0
    t.hooks.after_run()  # the reporter's thread is flushed, then the last report goes out
    reports = t.agent.client.bodies("learn-info")
    assert len(reports) >= 2 and reports[-1].train_iterations == 6  # the first was due at once
    assert t.publisher.submitted[-1] == 6 and t.checkpoints.entries[-1].train_iterations == 6


def test_the_off_policy_loop_leaves_a_broken_generation_and_stops_with_the_run(tmp_path,
                                                                              monkeypatch):
    feed = FakeFeed([], broken="a chunk of group batch 4 is gone")
    monkeypatch.setattr(off_policy, "open_feed", lambda t: feed)
    t = make_training(tmp_path)
    with pytest.raises(GroupError, match="batch 4"):
        OffPolicyLoop(t).run_generation()
    feed = FakeFeed([[batch() for _ in range(5)]])
    monkeypatch.setattr(off_policy, "open_feed", lambda t: feed)
    t = make_training(tmp_path / "2", assigned=assignment(1, rank=1, publisher=False))
    t.policy.on_learn = lambda n: t.closing.set() if n == 2 else None
    assert OffPolicyLoop(t).run_generation() is True  # closing: the run is over here
    assert t.policy.train_iterations == 2 and t.publisher.submitted == []  # not rank 0


# -- the on-policy loop ----------------------------------------------------------------------

class FakeRollouts:
    """A RolloutFeeder stand-in: `rounds` rollouts of two chunks each, then nothing."""

    rounds = 2

    def __init__(self, client: Any, storage: Any, worker_id: str, buffer: str,
                 rollout_size: int, max_policy_lag: int | None, packed: bool = False) -> None:
        self.buffer = buffer
        self.stop_run = self.group_ended = False
        self.broken: str | None = None
        self.consumed: list[str] = []
        self.dropped_chunks = self.dropped_rows = 0
        self.asked: list[int] = []
        self.left = self.rounds

    def next(self, learner_version: int) -> SimpleNamespace | None:
        self.asked.append(learner_version)
        if not self.left:
            self.group_ended = True
            return None
        self.left -= 1
        self.consumed += [f"c{self.left}a", f"c{self.left}b"]
        return SimpleNamespace(data={}, lag_mean=0.5, lag_max=1)

    def take_consumed(self) -> list[Consumed]:
        out = [Consumed(buffer=self.buffer, chunk_ids=self.consumed)] if self.consumed else []
        self.consumed = []
        return out

    def take_moments(self) -> list[dict]:
        return []


def ppo_training(tmp_path, answers: dict | None = None) -> Training:
    t = make_training(tmp_path, answers=answers)
    t.cfg = parse_config(make_config(
        algo={"name": "ppo", "batch_size": 64, "rollout_size": 256},
        buffers={"q": buffer_config(kind="queue", capacity=100_000)},
        learner={"mix": [{"buffer": "q", "fraction": 1.0}]}))
    return t


def test_the_on_policy_loop_learns_once_per_rollout_and_reports_what_it_consumed(
        tmp_path, monkeypatch):
    monkeypatch.setattr(on_policy, "RolloutFeeder", FakeRollouts)
    t = ppo_training(tmp_path)
    assert OnPolicyLoop(t).run_generation() is False
    assert t.policy.train_iterations == 2 and t.progress.learn_rounds == 2
    assert t.publisher.submitted == [1, 2]
    reports = t.agent.client.bodies("learn-info")
    assert [r.consumed[0].chunk_ids for r in reports] == [["c1a", "c1b"], ["c0a", "c0b"]]
    assert reports[-1].metrics["learn_rounds"] == 2.0 and "policy_lag_mean" in reports[-1].metrics
    assert t.progress.metrics == reports[-1].metrics


def test_the_on_policy_loop_stops_when_a_report_says_the_run_is_over(tmp_path, monkeypatch):
    monkeypatch.setattr(on_policy, "RolloutFeeder", FakeRollouts)
    t = ppo_training(tmp_path, answers={"learn-info": LearnInfoResponse(stop=True)})
    assert OnPolicyLoop(t).run_generation() is True
    assert t.policy.train_iterations == 1


def test_before_run_comes_once_the_group_formed_so_a_hook_sees_its_rank(tmp_path):
    seen: list[tuple[str, int, bool]] = []

    class Ranks:
        def before_run(self, ctx: Any) -> None:
            seen.append(("before_run", ctx.rank, ctx.is_publisher))

        def on_formed(self, ctx: Any) -> None:
            seen.append(("on_formed", ctx.rank, ctx.is_publisher))

    t = make_training(tmp_path, assigned=assignment(3, rank=1, world_size=2, publisher=False))
    loop = OffPolicyLoop(t)
    t.hooks.add_user_hook(Ranks(), 0, "learner.hooks[0]")
    loop.formed(assignment(3, rank=1, world_size=2, publisher=False))
    loop.formed(assignment(4, rank=0, world_size=1))  # the group formed again, alone
    assert seen == [("before_run", 1, False), ("on_formed", 1, False), ("on_formed", 0, True)]
