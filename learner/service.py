"""The learner service: train on what the coordinator samples, publish policy versions.

`LearnerService` is the glue between the worker plumbing (`shared/worker.py`) and training:
it accepts the learn task, builds the policy and the training's parts (`training.py`), and
runs the loop of its algorithm's kind (`rlfleet.learner.loops`) in every generation of its
learner group (`learner/group/session.py`) until the run ends, then the hooks' `after_run`
(on a crash too); `/status` and heartbeats read what those pieces count
(`training.py`'s `Progress`, `learner/observe/timers.py`). A group of one trains exactly
as a lone learner. Only the group's publisher (rank 0) publishes policy versions and writes
checkpoints; every rank reports its own learn-info, which the coordinator merges.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any
from urllib.parse import urlparse

import torch

from rlfleet.learner.group.member import GroupMember
from rlfleet.learner.group.session import GroupSession
from rlfleet.learner.loops import loop_for
from rlfleet.learner.observe.batch_log import BatchLogTaker
from rlfleet.learner.observe.timers import LearnerTimers, UpdateRate
from rlfleet.learner.output.checkpoints import CheckpointStore
from rlfleet.learner.output.publisher import Publisher
from rlfleet.learner.placement import Placement, place
from rlfleet.learner.training import Progress, Training
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.algos.reward_model import with_reward_model
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.base import Role
from rlfleet.shared.contract.wire.membership import HeartbeatResponse
from rlfleet.shared.contract.wire.tasks import LearnTask, TaskAccepted, TaskEnvelope
from rlfleet.shared.envs.make import run_spec
from rlfleet.shared.infra import inproc
from rlfleet.shared.infra.storage import Storage, open_storage
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.worker import WorkerService

log = logging.getLogger("rlfleet.learner")


def group_host(advertise_url: str) -> str:
    """Where this learner's group store listens: its service's host (loopback for a
    service of the single-process runner, which listens nowhere)."""
    if inproc.is_inproc(advertise_url):
        return "127.0.0.1"
    return urlparse(advertise_url).hostname or "127.0.0.1"


class LearnerService(WorkerService):
    role = Role.LEARNER

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task: LearnTask | None = None
        self._closing = threading.Event()
        self._loop: threading.Thread | None = None
        self._lock = threading.Lock()
        self.error: str | None = None
        self.torch_threads: int | None = None  # learner.torch_threads, once configured
        self.publisher = Publisher(self._closing)
        self.timers = LearnerTimers()
        self.progress = Progress()
        self.session = GroupSession(self.agent, self.publisher, self._closing)
        self._rate = UpdateRate()
        self.placement: Placement | None = None
        self.training: Training | None = None

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

    @staticmethod
    def _build_policy(cfg: RunConfig, seed: int) -> Policy:
        spec = run_spec(cfg)
        # algo.reward_model: every batch's rewards are rewritten before `learn` uses them
        policy = with_reward_model(make_policy(cfg.algo, spec, seed), cfg.algo, spec, seed)
        # what `rlfleet up` checked: a coordinator started by hand may hand out any config
        problem = cfg.feed_problem(type(policy).__name__, bool(policy.on_policy))
        if problem:
            raise ConfigError(problem)
        return policy

    def _run(self) -> None:
        # The prefetch thread holds the GIL in numpy/JSON work while the training thread waits
        # to resume after each torch call; a shorter switch interval than CPython's 5 ms keeps
        # those waits short.
        sys.setswitchinterval(0.0005)
        cfg = self.wait_config()
        assert self.task is not None
        torch.set_num_threads(cfg.learner.torch_threads)
        self.torch_threads = torch.get_num_threads()
        if self.torch_threads == 1:  # torch's own workers would inherit the one CPU
            self.turns.settle()
        seed = self.task.seed
        policy = self._build_policy(cfg, seed)
        self.placement = placement = place(policy, cfg.learner)  # learner.device, .precision
        storage = open_storage(self.storage_url, cfg.name)
        try:
            self.training = training = self._training(cfg, policy, storage, seed, placement)
            loop = loop_for(training)  # its built-in hooks and the user's, added
            training.resume()  # the policy's and the hooks' state from the last checkpoint
            host = group_host(self.agent.advertise_url)
            self.session.open(GroupMember(host, cfg.learner.group_port,
                                          cfg.learner.collective_timeout_s,
                                          device=placement.device))
            try:
                self.session.run(policy, storage, loop.formed, loop.run_generation)
            except Exception as err:  # what it learned since the last checkpoint is kept
                training.hooks.after_run(crashed=err)
                raise
            training.hooks.after_run()
        finally:
            self.session.close()
            storage.close()

    def _training(self, cfg: RunConfig, policy: Policy, storage: Storage, seed: int,
                  placement: Placement) -> Training:
        ck = cfg.checkpoint
        checkpoints = CheckpointStore(
            storage, ck.prefix, ck.keep_last,
            {**ck.metadata, "run": cfg.name, "algo": cfg.algo.name}, ck.dir)
        training = Training(cfg, policy, storage, self.storage_url, seed, self.agent,
                            self._closing, self.publisher, self.session, self.timers,
                            self.progress, checkpoints, placement=placement,
                            turns=self.turns)
        training.outbox.batch_log = BatchLogTaker(cfg.logging.batch_log)
        return training

    def on_heartbeat(self, hb: HeartbeatResponse) -> None:
        self.session.on_heartbeat(hb)

    def heartbeat_status(self) -> dict[str, float]:
        return {"train_iterations": float(self.progress.train_iterations),
                "policy_version": float(self.policy_version),
                "updates_per_s": round(self._rate(self.progress.train_iterations), 2),
                "data_wait_s": round(self.data_wait_s(), 1),
                **self.session.heartbeat_status()}

    def data_wait_s(self) -> float:
        """Seconds the training loop has waited for data without a break (0 before it
        trains)."""
        return self.training.shortage.seconds() if self.training is not None else 0.0

    def status(self) -> dict[str, Any]:
        p = self.progress
        return {"task_id": self.task.task_id if self.task else None,
                "train_iterations": p.train_iterations,
                "policy_version": self.policy_version, "metrics": p.metrics,
                "utilisation": self.timers.utilisation(),
                "timers": self.timers.status(self.publisher.seconds),
                "versions_superseded": self.publisher.superseded,
                "versions_relayed": self.publisher.relayed,
                "dropped_sample_responses": (p.prefetcher.dropped_responses
                                             if p.prefetcher else 0),
                "learn_rounds": p.learn_rounds,
                "torch_threads": self.torch_threads,
                "resumed_from_iteration": p.resumed_from,
                "last_checkpoint_iteration": p.last_checkpoint,
                "data_wait_s": round(self.data_wait_s(), 1),
                "nonfinite_metrics": (self.training.window.nonfinite_total
                                      if self.training is not None else 0),
                "dropped_stale_chunks": p.feeder.dropped_chunks if p.feeder else 0,
                "group": self.session.status(),
                "device": self.device_status(),
                "error": self.error}

    def device_status(self) -> dict[str, Any] | None:
        """`/status`'s `device`: where and in what precision this learner trains; on a GPU
        its memory in use, and the shares of the GPU's time in updates and waiting for
        data (from CUDA events: `learner/feed/staging.py`) since the learner started."""
        if self.placement is None:
            return None
        out = self.placement.status()
        if self.training is not None:
            out.update(self.training.gpu.fractions())
            out["staging"] = self.training.stager.status()
        return out

    def on_run_stopped(self) -> None:
        self._closing.set()

    def close(self) -> None:
        self._closing.set()
        if self._loop is not None:
            self._loop.join(timeout=15)
        self.publisher.close()
        super().close()
