"""Evaluation tasks: episodes (or self-play games) with the run's policy, an optional video,
and the report to the coordinator.

The collect loop runs them between chunks, on its own thread, once the run's policy acts.
A report that cannot be delivered (storage or coordinator down) is a warning, not a crash:
the coordinator asks again. An evaluation that raises (a user env failing in `step()`, say)
is `EvaluationCrashed`: the evaluation's task is what failed, not the collect task.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlfleet.collector.counters import CollectorCounters
from rlfleet.shared.contract.codec import encode_weights
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.evaluation import (
    BattleOutcome,
    EvalEpisodes,
    EvaluationReport,
    VideoReport,
)
from rlfleet.shared.contract.wire.tasks import EvaluateTask
from rlfleet.shared.envs.make import make_vector_env, with_env_kwargs
from rlfleet.shared.infra.http import HttpError
from rlfleet.shared.infra.storage import (
    Storage,
    StorageError,
    evaluated_blob,
    video_blob,
    video_gif_blob,
)
from rlfleet.shared.rollout.rollout import evaluate
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.worker import WorkerAgent

if TYPE_CHECKING:
    import gymnasium as gym

    from rlfleet.collector.acting import Acting
    from rlfleet.shared.algos.base import Policy
    from rlfleet.shared.rollout.battle import OpponentPool

log = logging.getLogger("rlfleet.collector")


class EvaluationCrashed(Exception):
    """An evaluation raised: the evaluation's task is what failed, and the crash is reported
    as one, not as the collect task's. The error that ended it is `__cause__`."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"evaluation {task_id} crashed")
        self.task_id = task_id


class Evaluator:
    """Runs evaluation tasks for one run and reports them. It keeps its vector env between
    tasks that ask for as many envs, and stops recording videos for good once this env
    could not render (one warning per process: the loop, and so the evaluator, is one)."""

    def __init__(self, cfg: RunConfig, storage: Storage, agent: WorkerAgent,
                 counters: CollectorCounters) -> None:
        self.cfg = cfg
        self.storage = storage
        self.agent = agent
        self.counters = counters
        self._envs: gym.vector.VectorEnv | None = None
        self._env_kwargs: dict = {}  # the env settings `_envs` were made with
        self._video_off = False

    def run(self, task: EvaluateTask, acting: Acting, pool: OpponentPool | None = None
            ) -> None:
        """Evaluate `acting`'s policy as `task` asks: games against `task.battles` where the
        run is a game (`pool` holds its opponents), episodes otherwise. Raises
        `EvaluationCrashed` (from what was raised) when the evaluation itself fails."""
        try:
            if pool is not None:
                self._battles(task, acting, pool)
            else:
                self._episodes(task, acting)
        except Exception as err:
            raise EvaluationCrashed(task.task_id) from err

    def close(self) -> None:
        if self._envs is not None:
            self._envs.close()
            self._envs = None

    # -- episodes ---------------------------------------------------------------------------

    def _envs_for(self, task: EvaluateTask) -> gym.vector.VectorEnv:
        if self._envs is None or self._envs.num_envs != task.num_envs \
                or self._env_kwargs != task.env_kwargs:
            self.close()
            self._envs = make_vector_env(with_env_kwargs(self.cfg.env, task.env_kwargs),
                                         task.num_envs, task.seed)
            self._env_kwargs = task.env_kwargs  # the commander's evaluation settings
        return self._envs

    def _episodes(self, task: EvaluateTask, acting: Acting) -> None:
        """Deterministic, then (if asked) stochastic episodes from the same seed, so the two
        figures differ only by how actions are chosen."""
        envs = self._envs_for(task)
        policy = acting.for_evaluation(task.policy_version)
        runs = {}
        for deterministic in (True, False) if task.stochastic else (True,):
            ev = self.cfg.eval
            done = evaluate(envs, policy, task.episodes, task.seed, deterministic,
                            ev.max_steps, tuple(ev.info_keys), ev.episode_return_key)
            # successes only from envs that report them: any other env's report has none
            known = any(s is not None for s in done.successes)
            runs["deterministic" if deterministic else "stochastic"] = EvalEpisodes(
                returns=done.returns, lengths=done.lengths,
                successes=done.successes if known else None, truncated=done.truncated,
                info=done.infos)
        self.counters.evaluations += 1
        try:
            video = self._record(task, policy) if task.video else None
            self._report(task, policy, EvaluationReport(
                worker_id=self.agent.worker_id, task_id=task.task_id,
                policy_version=policy.version, video=video, **runs))
        except (HttpError, StorageError) as err:
            log.warning("could not report evaluation %s: %s", task.task_id, err)

    def _record(self, task: EvaluateTask, policy: Policy) -> VideoReport | None:
        """The video the evaluation asked for, in storage; None (and one warning per
        process) when this env cannot render or the video extra is missing."""
        video = self.cfg.eval.video
        if video is None or self._video_off:
            return None
        from rlfleet.collector.video import record  # imageio only where videos are recorded
        from rlfleet.shared.telemetry.video import VideoUnavailable

        try:
            rec = record(with_env_kwargs(self.cfg.env, task.env_kwargs), policy, video,
                         task.seed)
        except VideoUnavailable as err:
            self._video_off = True
            log.warning("no evaluation videos from this collector: %s", err)
            return None
        self.storage.put_blob(video_blob(task.task_id), rec.mp4)
        self.storage.put_blob(video_gif_blob(task.task_id), rec.gif)
        return VideoReport(frames=rec.frames, fps=video.fps, episodes=len(rec.returns),
                           returns=rec.returns)

    # -- self-play games --------------------------------------------------------------------

    def _battles(self, task: EvaluateTask, acting: Acting, pool: OpponentPool) -> None:
        """`task.episodes` games against each opponent from each seat, the policy greedy;
        the games are also the report's deterministic episodes (+1, 0, -1 each)."""
        from rlfleet.shared.rollout.battle import battle_evaluate

        policy = acting.for_evaluation(task.policy_version)
        tallies = battle_evaluate(self.cfg, policy, pool, task.battles, task.episodes,
                                  task.seed, task.num_envs)
        returns = [r for t in tallies for r in t.returns]
        plies = [p for t in tallies for p in t.plies]
        self.counters.evaluations += 1
        if not returns:
            log.warning("evaluation %s: no opponent could be loaded", task.task_id)
            self.agent.end_task(task.task_id, "no evaluation opponent could be loaded")
            return
        try:
            self._report(task, policy, EvaluationReport(
                worker_id=self.agent.worker_id, task_id=task.task_id,
                policy_version=policy.version,
                deterministic=EvalEpisodes(returns=returns, lengths=plies),
                battles=[BattleOutcome(opponent=t.opponent, first=t.first, win=t.win,
                                       draw=t.draw, loss=t.loss) for t in tallies]))
        except (HttpError, StorageError) as err:
            log.warning("could not report evaluation %s: %s", task.task_id, err)

    # -- both -------------------------------------------------------------------------------

    def _report(self, task: EvaluateTask, policy: Policy, report: EvaluationReport) -> None:
        """Store the evaluated weights (the best-policy record reads them), then report."""
        self.storage.put_blob(evaluated_blob(task.task_id), encode_weights(
            policy.policy_state(), {"policy_version": str(policy.version)}))
        self.agent.client.post(f"{API}/evaluations", report)
