"""The learner service: train on what the coordinator samples, publish policy versions."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

import torch

from learner.checkpoints import CheckpointStore
from learner.feedback import PriorityFeedback
from learner.prefetch import Prefetcher
from learner.rollouts import RolloutFeeder
from shared.algos.base import Policy, make_policy
from shared.codec import encode_weights
from shared.config import ConfigError, RunConfig
from shared.envs import env_spec
from shared.http import HttpError
from shared.schemas import (
    API,
    Consumed,
    LearnInfo,
    LearnInfoResponse,
    LearnTask,
    MixShare,
    Role,
    TaskAccepted,
    TaskEnvelope,
)
from shared.storage import Storage, StorageError, open_storage
from shared.worker import WorkerService

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
        self.policy_version = -1
        self.metrics: dict[str, float] = {}
        self.error: str | None = None
        self.update_s = 0.0
        self.wait_s = 0.0
        self.publish_s = 0.0
        self.prefetcher: Prefetcher | None = None
        self.feedback = PriorityFeedback()
        self.feeder: RolloutFeeder | None = None
        self.learn_rounds = 0
        self.checkpoints: CheckpointStore | None = None
        self.cfg_checkpoint_every = 1 << 62
        self.last_checkpoint = 0
        self.checkpoint_s = 0.0
        self.resumed_from: int | None = None
        self._timer_mark: tuple[int, dict[str, float]] = (0, {})

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
            self.fail()

    def _publish(self, storage: Storage, policy: Policy) -> None:
        """Publish the next version; while storage is out (a Redis restart) training waits
        here, retrying with backoff, because versions must reach collectors in order."""
        t0 = time.perf_counter()
        version = self.policy_version + 1
        blob = encode_weights(policy.policy_state(),
                              {"policy_version": str(version),
                               "train_iterations": str(policy.train_iterations)})
        delay = 0.1
        while True:
            try:
                storage.put_weights(version, blob)
                break
            except StorageError as err:
                if self._closing.is_set():
                    raise
                log.warning("could not publish policy version %d (retrying in %.1fs): %s",
                            version, delay, err)
                self._closing.wait(delay)
                delay = min(2 * delay, 5.0)
        self.policy_version = version  # only once it is in storage
        self.publish_s += time.perf_counter() - t0

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
               "chunk_fetch": self.prefetcher.fetch_s if self.prefetcher else 0.0}
        its = policy.train_iterations - self._timer_mark[0]
        out = {}
        if its > 0:
            out = {f"{k}_ms": 1000.0 * (v - self._timer_mark[1].get(k, 0.0)) / its
                   for k, v in now.items()}
        self._timer_mark = (policy.train_iterations, now)
        return out

    def _maybe_checkpoint(self, policy: Policy, force: bool = False) -> None:
        every = self.cfg_checkpoint_every
        if self.checkpoints is None or (not force and policy.train_iterations
                                        - self.last_checkpoint < every):
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
        torch.set_num_threads(1)
        # The prefetch thread holds the GIL in numpy/JSON work while the training thread waits
        # to resume after each torch call; a shorter switch interval than CPython's 5 ms keeps
        # those waits short.
        sys.setswitchinterval(0.0005)
        cfg = self.wait_config()
        assert self.task is not None
        policy = make_policy(cfg.algo, env_spec(cfg.env), self.task.seed)
        queues = [p.buffer for p in cfg.learner.mix if cfg.buffers[p.buffer].kind == "queue"]
        if policy.on_policy and (len(cfg.learner.mix) != 1 or not queues):
            raise ConfigError("learner.mix: an on-policy algorithm learns from whole chunks "
                              "of exactly one queue buffer")
        if not policy.on_policy and queues:
            raise ConfigError(f"learner.mix: queue buffer {queues[0]!r} hands out whole "
                              "chunks, for on-policy algorithms only")
        if cfg.learner.by_buffer is not None:
            raise ConfigError("learner.by_buffer: the built-in learner trains on one batch "
                              "per update; use learner.mix to draw from several buffers")
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
            self.policy_version = -1 if latest is None else latest
            self._publish(storage, policy)
            if policy.on_policy:
                self._run_on_policy(cfg, storage, policy, queues[0])
            else:
                self._run_off_policy(cfg, storage, policy)
            self._publish(storage, policy)
            self._maybe_checkpoint(policy, force=True)
            self._report(policy, self.feeder.take_consumed() if self.feeder else None)
        finally:
            storage.close()

    def _run_off_policy(self, cfg: RunConfig, storage: Storage, policy: Policy) -> None:
        self.prefetcher = prefetcher = Prefetcher(
            self.agent.client, storage, self.agent.worker_id, cfg.algo.batch_size,
            cfg.learner.batches_per_request, cfg.learner.prefetch_requests,
            cfg.learner.chunk_cache,
            mix=[MixShare(buffer=p.buffer, fraction=p.fraction) for p in cfg.learner.mix]
            ).start()
        last_report = 0.0
        step_metrics: dict[str, Any] = {}
        try:
            while not self._closing.is_set() and not prefetcher.stop_run.is_set():
                t0 = time.perf_counter()
                batches = prefetcher.get(timeout=0.5)
                t1 = time.perf_counter()
                self.wait_s += t1 - t0
                if batches is None:
                    continue
                for batch in batches:
                    out = policy.learn(batch.data, batch.weights)
                    step_metrics = out.metrics
                    if batch.item_refs and out.priorities is not None:
                        self.feedback.add(batch, out.priorities)
                    if policy.train_iterations % cfg.learner.publish_every == 0:
                        self._publish(storage, policy)
                self.train_iterations = policy.train_iterations
                self.update_s += time.perf_counter() - t1
                self._maybe_checkpoint(policy)
                if time.monotonic() - last_report >= cfg.learner.learn_info_interval_s:
                    last_report = time.monotonic()
                    self.metrics = {k: float(v) for k, v in step_metrics.items()}
                    self.metrics.update(self._optimizer_metrics(policy))
                    if self._report(policy):
                        break
        finally:
            prefetcher.close()

    def _run_on_policy(self, cfg: RunConfig, storage: Storage, policy: Policy,
                       buffer: str) -> None:
        """Gather a rollout of whole chunks, learn on it once, publish, report the chunks
        consumed: the data of every round was acted by the last few policy versions."""
        self.feeder = feeder = RolloutFeeder(
            self.agent.client, storage, self.agent.worker_id, buffer,
            rollout_size=int(getattr(cfg.algo, "rollout_size", cfg.algo.batch_size)),
            max_policy_lag=getattr(cfg.algo, "max_policy_lag", None))
        while not self._closing.is_set() and not feeder.stop_run:
            t0 = time.perf_counter()
            rollout = feeder.next(self.policy_version)
            t1 = time.perf_counter()
            self.wait_s += t1 - t0
            if rollout is None:
                if feeder.consumed and self._report(policy, feeder.take_consumed()):
                    break  # dropped chunks are reported even when no rollout filled
                continue
            out = policy.learn(rollout.data)
            self._publish(storage, policy)
            self.train_iterations = policy.train_iterations
            self.update_s += time.perf_counter() - t1
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
                break

    @staticmethod
    def _optimizer_metrics(policy: Policy) -> dict[str, float]:
        optimizer = getattr(policy, "optimizer", None)
        if optimizer is None:
            return {}
        return {"learning_rate": float(optimizer.param_groups[0]["lr"])}

    def heartbeat_status(self) -> dict[str, float]:
        return {"train_iterations": float(self.train_iterations),
                "policy_version": float(self.policy_version)}

    def status(self) -> dict[str, Any]:
        busy = self.update_s + self.wait_s
        return {"task_id": self.task.task_id if self.task else None,
                "train_iterations": self.train_iterations,
                "policy_version": self.policy_version, "metrics": self.metrics,
                "utilisation": round(self.update_s / busy, 4) if busy else None,
                "timers": {"update_s": round(self.update_s, 3), "wait_s": round(self.wait_s, 3),
                           "publish_s": round(self.publish_s, 3)},
                "dropped_sample_responses": (self.prefetcher.dropped_responses
                                             if self.prefetcher else 0),
                "learn_rounds": self.learn_rounds,
                "resumed_from_iteration": self.resumed_from,
                "last_checkpoint_iteration": self.last_checkpoint,
                "dropped_stale_chunks": self.feeder.dropped_chunks if self.feeder else 0,
                "error": self.error}

    def on_run_stopped(self) -> None:
        self._closing.set()

    def close(self) -> None:
        self._closing.set()
        if self._loop is not None:
            self._loop.join(timeout=15)
        super().close()
