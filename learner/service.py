"""The learner service: train on what the coordinator samples, publish policy versions.

Every learner is a member of the run's learner group (`learner/group.py`), even alone: it asks
the coordinator for its place (`POST /api/v1/learner-group`), forms the generation it is
given, adopts rank 0's state, and trains until the generation ends (the coordinator says so
in a heartbeat or a 409, or one of its collectives fails); then it asks again. A group of one
trains exactly as a lone learner always did. Only the publisher (rank 0) publishes policy
versions and writes checkpoints; every rank reports its own learn-info (its priorities, the
chunks it consumed, its metrics), which the coordinator merges.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import torch

from rlfleet.learner.checkpoints import CheckpointStore
from rlfleet.learner.dataproc import DataProcess
from rlfleet.learner.dataset_eval import DatasetScorer
from rlfleet.learner.feedback import PriorityFeedback, updates_from
from rlfleet.learner.group import GroupError, GroupMember
from rlfleet.learner.prefetch import Prefetcher
from rlfleet.learner.publisher import PublishConflict, Publisher
from rlfleet.learner.reporter import Reporter
from rlfleet.learner.rollouts import RolloutFeeder
from rlfleet.learner.transforms import BatchTransforms
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import DataParallel, NormalizesObservations, Optimized
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.algos.reward_model import with_reward_model
from rlfleet.shared.contract.algo import RolloutSettings
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.schemas import (
    API,
    Consumed,
    GroupAssignment,
    GroupSyncRequest,
    HeartbeatResponse,
    LearnInfo,
    LearnInfoResponse,
    LearnTask,
    MixShare,
    Role,
    TaskAccepted,
    TaskEnvelope,
)
from rlfleet.shared.envs.make import run_spec
from rlfleet.shared.infra.http import HttpError
from rlfleet.shared.infra.storage import Storage, StorageError, open_storage
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.worker import WorkerService

log = logging.getLogger("rlfleet.learner")


class LearnerService(WorkerService):
    role = Role.LEARNER

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task: LearnTask | None = None
        self._closing = threading.Event()
        self._loop: threading.Thread | None = None
        self._lock = threading.Lock()
        self.train_iterations = 0
        self.publisher = Publisher(self._closing)
        self.metrics: dict[str, float] = {}
        self.dataset_scores: dict[str, float] = {}  # eval.dataset, not yet reported
        self.error: str | None = None
        self.update_s = 0.0
        self.update_cpu_s = 0.0  # the training thread's CPU time within update_s
        self.wait_s = 0.0
        self.publish_s = 0.0
        self.prefetcher: Prefetcher | DataProcess | None = None
        self.feedback = PriorityFeedback()
        self.feeder: RolloutFeeder | None = None
        self.learn_rounds = 0
        self.torch_threads: int | None = None  # learner.torch_threads, once configured
        self.checkpoints: CheckpointStore | None = None
        self.cfg_checkpoint_every = 1 << 62
        self.last_checkpoint = 0
        self.checkpoint_s = 0.0
        self.resumed_from: int | None = None
        self._timer_mark: tuple[int, dict[str, float]] = (0, {})
        # The learner group.
        self.member: GroupMember | None = None
        self.assignment: GroupAssignment | None = None
        self.group_generation_seen: int | None = None  # from the last heartbeat
        self.formations = 0
        self._formed_ok = False  # in a process group of the current assignment
        self._allreduce_s = 0.0  # in collectives of generations before the current one
        self._progress: deque[tuple[float, int]] = deque(maxlen=64)

    def accept(self, envelope: TaskEnvelope) -> TaskAccepted:
        task = envelope.task
        if not isinstance(task, LearnTask):
            return TaskAccepted(task_id=task.task_id, accepted=False)
        with self._lock:
            self.task = task
            if self._loop is None:
                self._loop = threading.Thread(target=self._run_guarded, name="learn",
                                              daemon=True)
                self._loop.start()
        return TaskAccepted(task_id=task.task_id, accepted=True)

    def _run_guarded(self) -> None:
        try:
            self._run()
            if self.task:
                self.agent.end_task(self.task.task_id)
        except Exception as err:  # reported to the coordinator, visible in /status
            log.exception("learner loop crashed")
            self.error = f"{type(err).__name__}: {err}"
            if self.task:
                self.agent.end_task(self.task.task_id, self.error)
            self.fail(err, "training")

    @property
    def policy_version(self) -> int:
        """The newest version this learner knows to be in storage."""
        return self.publisher.version

    def _publish(self, policy: Policy, wait: bool = True) -> None:
        """Publish the next version. The publish thread writes it (`learner/publisher.py`);
        `wait` (forming a group, ending) waits until it is in storage, retrying through an
        outage, because versions must reach collectors in order."""
        t0 = time.perf_counter()
        try:
            self.publisher.submit(policy.policy_state(), policy.train_iterations)
            if wait:
                self.publisher.flush()
        except PublishConflict as err:  # another learner publishes: this one must not
            raise GroupError(str(err)) from err
        self.publish_s += time.perf_counter() - t0

    @property
    def is_publisher(self) -> bool:
        """Publishes policy versions and writes checkpoints: rank 0 of the group."""
        return self.assignment is None or self.assignment.publisher

    @property
    def world_size(self) -> int:
        return self.assignment.world_size if self.assignment else 1

    def _allreduce_seconds(self) -> float:
        reducer = self.member.reducer if self.member else None
        return self._allreduce_s + (reducer.seconds if reducer else 0.0)

    def _report(self, policy: Policy, consumed: list[Consumed] | None = None) -> bool:
        """Send learn-info; True when the coordinator says the run is over. Consumed chunk
        ids that could not be delivered go back to the feeder for the next report."""
        consumed = consumed or []
        try:
            resp = self.agent.client.post(f"{API}/learn-info", LearnInfo(
                worker_id=self.agent.worker_id, train_iterations=policy.train_iterations,
                policy_version=self.policy_version, metrics=self.metrics,
                priorities=self.feedback.take(), consumed=consumed,
                timers=self._timers(policy)), LearnInfoResponse)
        except HttpError as err:
            # Priorities are soft state: a lost update only leaves older priorities in place.
            log.warning("learn-info not delivered: %s", err)
            if consumed and self.feeder is not None:
                self.feeder.give_back(consumed)
            return False
        if resp.best_policy_version is not None and self.checkpoints is not None:
            self.checkpoints.mark_best(resp.best_policy_version)
        return resp.stop

    def _timers(self, policy: Policy) -> dict[str, float]:
        """ms per train iteration since the last report, by phase."""
        now = {"sample_wait": self.wait_s, "update": max(0.0, self.update_s - self.publish_s),
               "publish": self.publish_s,
               "chunk_fetch": self.prefetcher.fetch_s if self.prefetcher else 0.0,
               "allreduce": self._allreduce_seconds()}
        its = policy.train_iterations - self._timer_mark[0]
        out = {}
        if its > 0:
            out = {f"{k}_ms": 1000.0 * (v - self._timer_mark[1].get(k, 0.0)) / its
                   for k, v in now.items()}
        self._timer_mark = (policy.train_iterations, now)
        return out

    @staticmethod
    def _merge_obs_stats(policy: Policy, moments: list[dict]) -> None:
        """algo.obs_norm: the chunks' raw-observation counts, into the statistics the next
        published version carries; a malformed entry is skipped with a warning."""
        if not isinstance(policy, NormalizesObservations):
            return
        for entry in moments:
            try:
                policy.merge_obs_stats(entry)
            except (KeyError, TypeError, ValueError) as err:
                log.warning("observation moments skipped: %s", err)

    def _maybe_checkpoint(self, policy: Policy, force: bool = False) -> None:
        every = self.cfg_checkpoint_every
        if self.checkpoints is None or not self.is_publisher or (
                not force and policy.train_iterations - self.last_checkpoint < every):
            return
        if policy.train_iterations == self.last_checkpoint and self.last_checkpoint > 0:
            return  # nothing new since the last one
        t0 = time.perf_counter()
        try:
            self.checkpoints.save(policy.state_dict(), policy.train_iterations,
                                  self.policy_version)
        except StorageError as err:  # an outage: the next interval tries again
            log.warning("checkpoint at train iteration %d not saved: %s",
                        policy.train_iterations, err)
            return
        self.last_checkpoint = policy.train_iterations
        self.checkpoint_s += time.perf_counter() - t0

    def _run(self) -> None:
        # The prefetch thread holds the GIL in numpy/JSON work while the training thread waits
        # to resume after each torch call; a shorter switch interval than CPython's 5 ms keeps
        # those waits short.
        sys.setswitchinterval(0.0005)
        cfg = self.wait_config()
        assert self.task is not None
        torch.set_num_threads(cfg.learner.torch_threads)
        self.torch_threads = torch.get_num_threads()
        spec = run_spec(cfg)
        # algo.reward_model: every batch's rewards are rewritten before `learn` uses them
        policy = with_reward_model(make_policy(cfg.algo, spec, self.task.seed), cfg.algo,
                                   spec, self.task.seed)
        # what `rlfleet up` checked: a coordinator started by hand may hand out any config
        problem = cfg.feed_problem(type(policy).__name__, bool(policy.on_policy))
        if problem:
            raise ConfigError(problem)
        queues = [p.buffer for p in cfg.learner.mix if cfg.buffers[p.buffer].kind == "queue"]
        storage = open_storage(self.storage_url, cfg.name)
        try:
            ck = cfg.checkpoint
            self.cfg_checkpoint_every = ck.every_train_iterations
            self.checkpoints = CheckpointStore(
                storage, ck.prefix, ck.keep_last,
                {**ck.metadata, "run": cfg.name, "algo": cfg.algo.name})
            restored = self.checkpoints.latest()
            if restored is not None:  # a restarted learner or a resumed run
                policy.load_state_dict(restored[0])
                self.resumed_from = self.last_checkpoint = policy.train_iterations
                log.info("resumed from checkpoint at train iteration %d", self.resumed_from)
            self._timer_mark = (policy.train_iterations, {})
            # Versions only ever increase, also across learner restarts.
            latest = storage.latest_version()
            self.publisher.attach(storage, -1 if latest is None else latest)
            host = urlparse(self.agent.advertise_url).hostname or "127.0.0.1"
            self.member = GroupMember(host, cfg.learner.group_port,
                                      cfg.learner.collective_timeout_s)
            self._train_in_group(cfg, storage, policy, queues)
            if self.is_publisher and self.assignment is not None:
                self._publish(policy)
                self._maybe_checkpoint(policy, force=True)
            self._report(policy, self.feeder.take_consumed() if self.feeder else None)
        finally:
            if self.member is not None:
                self.member.close()
            storage.close()

    def _train_in_group(self, cfg: RunConfig, storage: Storage, policy: Policy,
                        queues: list[str]) -> None:
        """Join a generation, train in it until it ends, join the next; until the run ends."""
        broken: str | None = None
        while not self._closing.is_set():
            assignment = self._sync_group(broken)
            if assignment is None:
                return
            broken = None
            try:
                if self.assignment is None or assignment.generation != \
                        self.assignment.generation or not self._formed_ok:
                    self._form(assignment, policy, storage)
                if policy.on_policy:
                    over = self._run_on_policy(cfg, storage, policy, queues[0])
                else:
                    over = self._run_off_policy(cfg, storage, policy)
            except GroupError as err:
                log.warning("learner group generation %d broke: %s", assignment.generation,
                            err)
                self._formed_ok = False
                broken = str(err)[:2000]
                continue
            if over:
                return

    def _sync_group(self, broken: str | None) -> GroupAssignment | None:
        """This learner's place in the current generation; waits as a standby while it has
        none. None when the learner is closing."""
        assert self.member is not None
        req = GroupSyncRequest(worker_id=self.agent.worker_id,
                               store_addr=self.member.store_addr,
                               generation=self.assignment.generation if self.assignment
                               else None, broken=broken)
        while not self._closing.is_set():
            try:
                got = self.agent.client.post(f"{API}/learner-group", req, GroupAssignment)
            except HttpError as err:
                log.warning("learner group sync failed: %s", err)
                self._closing.wait(0.5)
                continue
            self.group_generation_seen = None
            if got.rank is not None:
                return got
            if self.assignment is None or self.assignment.generation != got.generation:
                log.info("standby in learner group generation %d (%d ranks)", got.generation,
                         got.world_size)
                self._leave_generation()
                self.assignment = got
            req = req.model_copy(update={"broken": None, "generation": got.generation})
            self._closing.wait(1.0)
        return None

    def _leave_generation(self) -> None:
        assert self.member is not None
        self._allreduce_s = self._allreduce_seconds()
        self.member.leave()
        self._formed_ok = False

    def _form(self, assignment: GroupAssignment, policy: Policy, storage: Storage) -> None:
        """Join `assignment`'s process group and adopt rank 0's state and policy version;
        the publisher then announces a version of its own (collectors follow it)."""
        assert self.member is not None
        if assignment.world_size > 1 and not isinstance(policy, DataParallel):
            raise ConfigError(f"algo.policy={type(policy).__name__} is not DataParallel (it "
                              "has no set_reducer): it cannot learn in a group; use "
                              "learner.count: 1")
        self._leave_generation()
        self.assignment = assignment
        try:  # versions handed over in the last generation go out before this one's
            self.publisher.flush()
        except PublishConflict as err:
            log.info("the last generation's pending version was not published: %s", err)
        reducer = self.member.form(assignment)
        if isinstance(policy, DataParallel):
            policy.set_reducer(reducer)
        latest = self.policy_version
        if assignment.publisher:
            try:  # another rank may have published since this one last looked
                latest = max(latest, storage.latest_version() or -1)
            except StorageError as err:
                log.warning("latest policy version unknown (%s): going on from %d", err, latest)
        if assignment.world_size > 1:
            state, latest = self.member.broadcast_state(
                policy.state_dict() if assignment.rank == 0 else None, latest)
            if assignment.rank != 0:
                policy.load_state_dict(state)
        self.publisher.attach(storage, latest)
        self.train_iterations = policy.train_iterations
        self._formed_ok = True
        self.formations += 1
        log.info("learner group generation %d formed: rank %s of %d, train iteration %d, "
                 "policy version %d", assignment.generation, assignment.rank,
                 assignment.world_size, policy.train_iterations, self.policy_version)
        if assignment.publisher:
            self._publish(policy)

    def _generation_moved(self) -> bool:
        """A heartbeat told of a newer generation. Only newer: an answer sent before this
        learner's last sync may tell of an older one (a coordinator that restarted and
        counts generations anew answers the next sample request with 409 instead)."""
        seen = self.group_generation_seen
        return (self.assignment is not None and seen is not None
                and seen > self.assignment.generation)

    def on_heartbeat(self, hb: HeartbeatResponse) -> None:
        if hb.group_generation is not None:
            self.group_generation_seen = hb.group_generation

    def _run_off_policy(self, cfg: RunConfig, storage: Storage, policy: Policy) -> bool:
        """Train until the run ends (True) or the generation does (False)."""
        assert self.assignment is not None
        self.prefetcher = prefetcher = self._feed(cfg, storage)
        if isinstance(prefetcher, DataProcess):
            self.publisher.route(prefetcher.put_weights)
        reporter = Reporter(self.agent.client)
        interval = cfg.learner.learn_info_interval_s
        min_interval = cfg.learner.publish_min_interval_s
        step_metrics: dict[str, Any] = {}
        scorer = (DatasetScorer(cfg, run_spec(cfg))
                  if cfg.eval.dataset is not None and self.is_publisher else None)
        try:
            while not self._closing.is_set() and not prefetcher.stop_run.is_set():
                if reporter.stop_run.is_set():
                    return True
                self._mark_best(reporter)
                if prefetcher.group_ended.is_set():  # what it still holds is not learned
                    if prefetcher.broken:   # from: the other ranks may have moved on
                        raise GroupError(prefetcher.broken)
                    return False
                if self._generation_moved():
                    return False
                t0 = time.perf_counter()
                batches = prefetcher.get(timeout=0.5)
                t1, c1 = time.perf_counter(), time.thread_time()
                self.wait_s += t1 - t0
                if batches is None:
                    continue
                for batch in batches:
                    if reporter.stop_run.is_set() or self._closing.is_set():
                        return True  # the run is over: publish and report at once
                    out = policy.learn(batch.data, batch.weights)
                    step_metrics = out.metrics
                    if batch.item_refs and out.priorities is not None:
                        self.feedback.add(batch, out.priorities)
                    if self.is_publisher and \
                            policy.train_iterations % cfg.learner.publish_every == 0 and \
                            self.publisher.due(min_interval):
                        self._publish(policy, wait=False)
                    self.train_iterations = policy.train_iterations
                    if scorer is not None and scorer.due(policy.train_iterations):
                        self.dataset_scores = scorer.score(policy, policy.train_iterations)
                    # Within a response too: with a large network one response is seconds
                    # of updates, and progress (and priorities) should not wait for its end.
                    if reporter.due(interval):
                        self.metrics = {k: float(v) for k, v in step_metrics.items()}
                        self.metrics.update(self._optimizer_metrics(policy))
                        reporter.send(self._learn_info(policy))
                self._count_update(t1, c1)
                self._maybe_checkpoint(policy)
            return True
        finally:
            reporter.close()  # what it still holds goes out before the final report
            self._mark_best(reporter)
            # Without waiting for the data process (it may be in a sample request for a
            # second): the final version and report go out first, stored by this process.
            self.publisher.route(None)
            prefetcher.close(wait=False)

    def _feed(self, cfg: RunConfig, storage: Storage) -> Prefetcher | DataProcess:
        """The source of ready batches: a data process of this learner's own, or a thread."""
        assert self.assignment is not None
        mix = [MixShare(buffer=p.buffer, fraction=p.fraction) for p in cfg.learner.mix]
        generation = self.assignment.generation if self.world_size > 1 else None
        # n-step returns, hindsight relabelling, per-buffer rewards (learner/transforms.py)
        transforms = BatchTransforms.from_config(
            cfg, seed=(self.task.seed if self.task else cfg.seed) * 1009
            + (self.assignment.rank or 0))
        if cfg.learner.data_process:
            return DataProcess(
                self.agent.client.base_url, self.storage_url, cfg.name, self.agent.worker_id,
                cfg.algo.batch_size, cfg.learner.batches_per_request,
                cfg.learner.prefetch_requests, cfg.learner.chunk_cache, mix=mix,
                group_generation=generation, transforms=transforms).start()
        return Prefetcher(
            self.agent.client, storage, self.agent.worker_id, cfg.algo.batch_size,
            cfg.learner.batches_per_request, cfg.learner.chunk_cache, mix=mix,
            group_generation=generation, depth=cfg.learner.prefetch_requests,
            transforms=transforms).start()

    def _learn_info(self, policy: Policy) -> Callable[[], LearnInfo]:
        """A report's snapshot, taken on the training thread; the body is built on the
        reporting thread."""
        worker_id, iterations, version = (self.agent.worker_id, policy.train_iterations,
                                          self.policy_version)
        metrics, priorities, timers = dict(self.metrics), self.feedback.take_arrays(), \
            self._timers(policy)
        scores, self.dataset_scores = self.dataset_scores, {}
        return lambda: LearnInfo(worker_id=worker_id, train_iterations=iterations,
                                 policy_version=version, metrics=metrics,
                                 priorities=updates_from(priorities), consumed=[],
                                 timers=timers, dataset_eval=scores)

    def _mark_best(self, reporter: Reporter) -> None:
        best = reporter.best_policy_version
        if best is not None and self.checkpoints is not None:
            reporter.best_policy_version = None
            self.checkpoints.mark_best(best)

    def _run_on_policy(self, cfg: RunConfig, storage: Storage, policy: Policy,
                       buffer: str) -> bool:
        """Gather a rollout of whole chunks (in a group: this rank's share of the group's
        rollout), learn on it once, publish, report the chunks consumed: the data of every
        round was acted by the last few policy versions. True when the run ends, False when
        the generation does."""
        grouped = self.world_size > 1
        assert self.assignment is not None
        if self.feeder is not None and self.feeder.consumed:
            self._report(policy, self.feeder.take_consumed())
        self.feeder = feeder = RolloutFeeder(
            self.agent.client, storage, self.agent.worker_id, buffer,
            rollout_size=cfg.rollout_rows,
            max_policy_lag=(cfg.algo.max_policy_lag if isinstance(cfg.algo, RolloutSettings)
                            else None))
        while not self._closing.is_set() and not feeder.stop_run:
            if feeder.broken:
                raise GroupError(feeder.broken)
            if feeder.group_ended or self._generation_moved():
                return False
            t0 = time.perf_counter()
            if grouped:
                rollout = feeder.next_share(self.assignment.generation, self.policy_version)
            else:
                rollout = feeder.next(self.policy_version)
            t1, c1 = time.perf_counter(), time.thread_time()
            self.wait_s += t1 - t0
            if rollout is None:
                if feeder.consumed and self._report(policy, feeder.take_consumed()):
                    return True  # dropped chunks are reported even when no rollout filled
                continue
            self._merge_obs_stats(policy, feeder.take_moments())
            out = policy.learn(rollout.data)
            if self.is_publisher:
                self._publish(policy)
            self.train_iterations = policy.train_iterations
            self._count_update(t1, c1)
            self.learn_rounds += 1
            self._maybe_checkpoint(policy)
            self.metrics = {k: float(v) for k, v in out.metrics.items()}
            self.metrics.update(self._optimizer_metrics(policy))
            self.metrics.update(policy_lag_mean=rollout.lag_mean,
                                policy_lag_max=float(rollout.lag_max),
                                dropped_stale_chunks=float(feeder.dropped_chunks),
                                dropped_stale_rows=float(feeder.dropped_rows),
                                learn_rounds=float(self.learn_rounds))
            if self._report(policy, feeder.take_consumed()):
                return True
        return True

    def _count_update(self, t1: float, c1: float) -> None:
        """Wall and training-thread CPU time since (`time.perf_counter()`,
        `time.thread_time()`) = (t1, c1): their gap is time lost to the GIL or a core."""
        self.update_s += time.perf_counter() - t1
        self.update_cpu_s += time.thread_time() - c1

    @staticmethod
    def _optimizer_metrics(policy: Policy) -> dict[str, float]:
        if not isinstance(policy, Optimized):
            return {}
        return {"learning_rate": float(policy.optimizer.param_groups[0]["lr"])}

    def updates_per_s(self) -> float:
        now = time.monotonic()
        self._progress.append((now, self.train_iterations))
        recent = [p for p in self._progress if p[0] >= now - 10.0]
        (t0, i0), (t1, i1) = recent[0], recent[-1]
        return (i1 - i0) / (t1 - t0) if t1 > t0 else 0.0

    def heartbeat_status(self) -> dict[str, float]:
        a = self.assignment
        return {"train_iterations": float(self.train_iterations),
                "policy_version": float(self.policy_version),
                "updates_per_s": round(self.updates_per_s(), 2),
                "group_generation": float(a.generation if a else -1),
                "group_rank": float(a.rank if a and a.rank is not None else -1),
                "group_world_size": float(a.world_size if a else 0)}

    def group_status(self) -> dict[str, Any] | None:
        a = self.assignment
        if a is None:
            return None
        return {"generation": a.generation, "rank": a.rank, "world_size": a.world_size,
                "publisher": a.publisher, "ranks": a.ranks, "formations": self.formations,
                "allreduce_s": round(self._allreduce_seconds(), 3),
                "store_addr": self.member.store_addr if self.member else None}

    def status(self) -> dict[str, Any]:
        busy = self.update_s + self.wait_s
        return {"task_id": self.task.task_id if self.task else None,
                "train_iterations": self.train_iterations,
                "policy_version": self.policy_version, "metrics": self.metrics,
                "utilisation": round(self.update_s / busy, 4) if busy else None,
                # update_cpu_s well below update_s: the training thread waited for the GIL
                # or for a core, not for data
                "timers": {"update_s": round(self.update_s, 3),
                           "update_cpu_s": round(self.update_cpu_s, 3),
                           "wait_s": round(self.wait_s, 3),
                           "publish_s": round(self.publish_s, 3),
                           "publish_thread_s": round(self.publisher.seconds, 3)},
                "versions_superseded": self.publisher.superseded,
                "versions_relayed": self.publisher.relayed,
                "dropped_sample_responses": (self.prefetcher.dropped_responses
                                             if self.prefetcher else 0),
                "learn_rounds": self.learn_rounds,
                "torch_threads": self.torch_threads,
                "resumed_from_iteration": self.resumed_from,
                "last_checkpoint_iteration": self.last_checkpoint,
                "dropped_stale_chunks": self.feeder.dropped_chunks if self.feeder else 0,
                "group": self.group_status(),
                "error": self.error}

    def on_run_stopped(self) -> None:
        self._closing.set()

    def close(self) -> None:
        self._closing.set()
        if self._loop is not None:
            self._loop.join(timeout=15)
        self.publisher.close()
        super().close()
