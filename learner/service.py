"""The learner service: train on what the coordinator samples, publish policy versions."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

import torch

from learner.dqn import DQNLearner
from learner.feedback import PriorityFeedback
from learner.prefetch import Prefetcher
from shared.codec import encode_weights
from shared.config import ConfigError
from shared.envs import env_spec
from shared.http import HttpError
from shared.schemas import (
    API,
    LearnInfo,
    LearnInfoResponse,
    LearnTask,
    MixShare,
    Role,
    TaskAccepted,
    TaskEnvelope,
)
from shared.storage import Storage, open_storage
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

    def _publish(self, storage: Storage, learner: DQNLearner) -> None:
        t0 = time.perf_counter()
        version = self.policy_version + 1
        blob = encode_weights(learner.policy_state(),
                              {"policy_version": str(version),
                               "train_iterations": str(learner.train_iterations)})
        storage.put_weights(version, blob)
        self.policy_version = version  # only once it is in storage
        self.publish_s += time.perf_counter() - t0

    def _report(self, learner: DQNLearner) -> bool:
        """Send learn-info; True when the coordinator says the run is over."""
        try:
            resp = self.agent.client.post(f"{API}/learn-info", LearnInfo(
                worker_id=self.agent.worker_id, train_iterations=learner.train_iterations,
                policy_version=self.policy_version, metrics=self.metrics,
                priorities=self.feedback.take()), LearnInfoResponse)
        except HttpError as err:
            # Priorities are soft state: a lost update only leaves older priorities in place.
            log.warning("learn-info not delivered: %s", err)
            return False
        return resp.stop

    def _run(self) -> None:
        torch.set_num_threads(1)
        # The prefetch thread holds the GIL in numpy/JSON work while the training thread waits
        # to resume after each torch call; a shorter switch interval than CPython's 5 ms keeps
        # those waits short.
        sys.setswitchinterval(0.0005)
        cfg = self.wait_config()
        assert self.task is not None
        storage = open_storage(self.storage_url, cfg.name)
        if cfg.learner.by_buffer is not None:
            raise ConfigError("learner.by_buffer: DQN learns from one batch per update; "
                              "use learner.mix to draw from several buffers")
        learner = DQNLearner(cfg.algo, env_spec(cfg.env), seed=self.task.seed)
        # Versions only ever increase, also across learner restarts.
        latest = storage.latest_version()
        self.policy_version = -1 if latest is None else latest
        self._publish(storage, learner)
        self.prefetcher = prefetcher = Prefetcher(
            self.agent.client, storage, self.agent.worker_id, cfg.algo.batch_size,
            cfg.learner.batches_per_request, cfg.learner.prefetch_requests,
            cfg.learner.chunk_cache,
            mix=[MixShare(buffer=p.buffer, fraction=p.fraction) for p in cfg.learner.mix]
            ).start()
        last_report = 0.0
        step_metrics: dict[str, torch.Tensor] = {}
        try:
            while not self._closing.is_set() and not prefetcher.stop_run.is_set():
                t0 = time.perf_counter()
                batches = prefetcher.get(timeout=0.5)
                t1 = time.perf_counter()
                self.wait_s += t1 - t0
                if batches is None:
                    continue
                for batch in batches:
                    result = learner.update(batch.data, batch.weights)
                    step_metrics = result.metrics
                    if batch.item_refs:
                        self.feedback.add(batch, result.td_abs)
                    if learner.train_iterations % cfg.learner.publish_every == 0:
                        self._publish(storage, learner)
                self.train_iterations = learner.train_iterations
                self.update_s += time.perf_counter() - t1
                if time.monotonic() - last_report >= cfg.learner.learn_info_interval_s:
                    last_report = time.monotonic()
                    self.metrics = {k: float(v) for k, v in step_metrics.items()}
                    if self._report(learner):
                        break
            self._publish(storage, learner)
            self._report(learner)
        finally:
            prefetcher.close()
            storage.close()

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
                "error": self.error}

    def on_run_stopped(self) -> None:
        self._closing.set()

    def close(self) -> None:
        self._closing.set()
        if self._loop is not None:
            self._loop.join(timeout=15)
        super().close()
