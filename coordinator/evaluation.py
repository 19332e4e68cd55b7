"""Evaluation scheduling: when the run's policy is evaluated, by whom, and what is kept.

An evaluation is a task like any other, pushed to a collector whose collect loop is running
(a worker whose loop failed has nothing left to run it on), round robin so one collector
does not pay for every evaluation. It falls due every `eval.every_env_steps` env steps or
`eval.every_train_iterations` train iterations, not before `eval.start_env_steps`, and only
one runs at a time. The evaluation of a collector that dies moves to another busy
collector; one not reported within `EVAL_TIMEOUT_S` fails, so a lost one cannot hold up
the next.

The best-evaluated policy is the run's result: its weights are copied to `best_policy` in
storage (and the run directory) as soon as its report arrives, because the published
version it ran with is pruned long before an evaluation ends. The schedule's state goes into
the coordinator's snapshot (`SavedEvaluations`); an evaluation in flight when the
coordinator stopped is run again, since its report would find no one waiting.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlfleet.coordinator.membership import Membership
from rlfleet.coordinator.tasks import TaskRecord, TaskTable
from rlfleet.shared.contract.wire.base import Role, TaskKind, TaskState
from rlfleet.shared.contract.wire.evaluation import (
    BattleOutcome,
    EvalEpisodes,
    EvalSummary,
    EvaluationReport,
    EvaluationResult,
)
from rlfleet.shared.contract.wire.tasks import EvaluateTask, Opponent
from rlfleet.shared.contract.wire.views import EvaluationList
from rlfleet.shared.infra.storage import Storage, evaluated_blob, video_blob, video_gif_blob
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")

EVAL_TIMEOUT_S = 120.0
VIDEO_DIR = "videos"  # in the run dir
ShowVideo = Callable[[str, int, Path, "bytes | None", int], None]
EVALUATION_WINDOW = 500  # evaluations kept in memory and in snapshots (`GET /evaluations`)


def summarise_episodes(episodes: EvalEpisodes) -> EvalSummary:
    r = np.asarray(episodes.returns, dtype=np.float64)
    return EvalSummary(episodes=len(r), return_mean=float(r.mean()), return_std=float(r.std()),
                       return_min=float(r.min()), return_max=float(r.max()),
                       length_mean=float(np.mean(episodes.lengths)),
                       success_rate=episodes.success_rate,
                       truncated=(None if episodes.truncated is None
                                  else sum(episodes.truncated)),
                       info={key: float(np.mean(known)) for key, values in episodes.info.items()
                             if (known := [v for v in values if v is not None])})


def battle_rates(outcomes: list[BattleOutcome]) -> dict[str, dict[str, float]]:
    """Win, draw and loss rates and games by opponent, overall ('bot-random') and by seat
    ('bot-random/first', 'bot-random/second')."""
    counts: dict[str, list[int]] = {}
    for o in outcomes:
        for key in (o.opponent, f"{o.opponent}/{'first' if o.first else 'second'}"):
            acc = counts.setdefault(key, [0, 0, 0])
            acc[0] += o.win
            acc[1] += o.draw
            acc[2] += o.loss
    out = {}
    for key, (win, draw, loss) in counts.items():
        games = win + draw + loss
        out[key] = {"win": win / max(1, games), "draw": draw / max(1, games),
                    "loss": loss / max(1, games), "games": float(games)}
    return out


class SavedEvaluations(BaseModel):
    """The evaluation schedule's part of a coordinator snapshot. Fields added since the
    first format have defaults, and what an older snapshot lacks is made up from what it
    holds (`_earlier_formats`), so every snapshot still reads."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    next_eval_at: int | None = None  # None: where a fresh schedule starts
    next_eval_iteration: int = 0
    best_policy_version: int | None = None
    # the newest `EVALUATION_WINDOW` evaluations; the whole history is in metrics.jsonl
    evaluations: list[EvaluationResult] = Field(default_factory=list)
    evaluations_total: int = 0  # reported in the whole run: the last one's `seq`
    best_evaluation: EvaluationResult | None = None
    best_score: float | None = None  # how `best_evaluation` ranked (commander's `score`)

    @model_validator(mode="before")
    @classmethod
    def _earlier_formats(cls, saved: Any) -> Any:
        """An older snapshot counted no total (its window was all there was) and kept no
        score (the mean return was its ranking)."""
        if not isinstance(saved, dict):
            return saved
        saved = dict(saved)
        if saved.get("evaluations_total") is None:
            saved["evaluations_total"] = len(saved.get("evaluations") or [])
        best = saved.get("best_evaluation")
        if "best_score" not in saved and isinstance(best, dict):
            saved["best_score"] = best.get("return_mean")
        return saved

    @model_validator(mode="after")
    def _numbered(self) -> SavedEvaluations:
        """An earlier version's evaluations have no sequence numbers: they end at the
        total."""
        if any(e.seq == 0 for e in self.evaluations):
            first = self.evaluations_total - len(self.evaluations) + 1
            self.evaluations = [e.model_copy(update={"seq": first + i})
                                for i, e in enumerate(self.evaluations)]
        return self


class EvaluationSchedule:
    """Owned by the coordinator, which passes the run's counters in at each call rather than
    lending itself: this module knows the task table, membership and storage, never the
    coordinator."""

    def __init__(self, cfg: RunConfig, tasks: TaskTable, members: Membership, storage: Storage,
                 run_dir: Path | None, push: Callable[[TaskRecord], None],
                 battles: Callable[[], list[Opponent]] | None = None,
                 solves: Callable[[EvaluationResult], str | None] | None = None,
                 show_video: ShowVideo | None = None,
                 env_kwargs: Callable[[], dict[str, Any]] | None = None,
                 score: Callable[[EvaluationResult, dict[str, Any]], float | None] | None = None
                 ) -> None:
        self.cfg = cfg
        self._env_kwargs = env_kwargs  # the commander's env settings of an evaluation
        # how an evaluation ranks for the run's best policy (the commander's `score`: a
        # curriculum's hardest level first); None: its mean return
        self._score = score
        self.best_score: float | None = None
        self.tasks = tasks
        self.members = members
        self.storage = storage
        self.run_dir = run_dir
        self._push = push  # hands a task to the coordinator's commander
        self._battles = battles  # self-play: whom an evaluation plays
        self._solves = solves  # self-play: why an evaluation solves the run (its win rates)
        self._show_video = show_video  # the run's logger: TensorBoard and W&B
        # The newest evaluations only: a week of frequent evaluations is a million results,
        # and every snapshot copies what is kept. The whole history is in metrics.jsonl.
        self.evaluations: deque[EvaluationResult] = deque(maxlen=EVALUATION_WINDOW)
        self.total = 0  # evaluations reported in the whole run: the last one's `seq`
        self.best_evaluation: EvaluationResult | None = None
        self.best_policy_version: int | None = None
        self.next_eval_at = max(cfg.eval.every_env_steps or 0, cfg.eval.start_env_steps)
        self.next_eval_iteration = cfg.eval.every_train_iterations or 0
        self._rr = 0  # round robin over collectors; also varies each evaluation's seed

    def due(self, env_steps: int, train_iterations: int) -> bool:
        ev = self.cfg.eval
        if env_steps < ev.start_env_steps:
            return False
        return ((ev.every_env_steps is not None and env_steps >= self.next_eval_at)
                or (ev.every_train_iterations is not None
                    and train_iterations >= self.next_eval_iteration))

    def maybe_start(self, policy_version: int, env_steps: int, train_iterations: int) -> None:
        if not self.due(env_steps, train_iterations) or policy_version < 0:
            return
        if self.tasks.active(TaskKind.EVALUATE):
            return
        # Only collectors whose collect task is running: a worker whose loop failed has no
        # loop left to run the evaluation on.
        busy = {r.worker_id for r in self.tasks.active(TaskKind.COLLECT)
                if r.state is TaskState.RUNNING}
        collectors = sorted((w for w in self.members.alive(Role.COLLECTOR)
                             if w.worker_id in busy), key=lambda w: w.worker_id)
        if not collectors:
            return
        worker = collectors[self._rr % len(collectors)]
        self._rr += 1
        ev = self.cfg.eval
        video = (ev.video is not None and self._battles is None
                 and (self._rr - 1) % ev.video.every_evaluations == 0)
        task = EvaluateTask(task_id=self.tasks.new_id(TaskKind.EVALUATE),
                            policy_version=policy_version, episodes=ev.episodes,
                            num_envs=min(ev.num_envs, ev.episodes),
                            seed=self.cfg.seed * 7919 + self._rr,
                            stochastic=ev.stochastic and self._battles is None,
                            battles=self._battles() if self._battles else [], video=video,
                            env_kwargs=self._env_kwargs() if self._env_kwargs else {})
        if ev.every_env_steps is not None:
            self.next_eval_at = env_steps + ev.every_env_steps
        if ev.every_train_iterations is not None:
            self.next_eval_iteration = train_iterations + ev.every_train_iterations
        self._push(self.tasks.add(task, worker.worker_id))

    def reassign(self, rec: TaskRecord, why: str) -> None:
        """Its collector is gone: another busy collector runs it, or it fails."""
        busy = sorted(r.worker_id for r in self.tasks.active(TaskKind.COLLECT)
                      if r.state is TaskState.RUNNING and r.worker_id != rec.worker_id)
        alive = {w.worker_id for w in self.members.alive(Role.COLLECTOR)}
        targets = [w for w in busy if w in alive]
        if not targets:
            self.tasks.end(rec.task_id, TaskState.FAILED, why)
            return
        old, rec.worker_id = rec.worker_id, targets[0]
        rec.state, rec.reassignments = TaskState.PENDING, rec.reassignments + 1
        log.warning("evaluation %s moves from %s to %s: %s", rec.task_id, old, rec.worker_id,
                    why)
        self._push(rec)

    def expire(self, now: float) -> None:
        """Fail evaluations older than `EVAL_TIMEOUT_S`: while one is active no other
        starts, so a collector that never answers must not stall evaluation for good."""
        for rec in self.tasks.active(TaskKind.EVALUATE):
            if now - rec.created_at > EVAL_TIMEOUT_S:
                self.tasks.end(rec.task_id, TaskState.FAILED, "evaluation timed out")

    def report(self, req: EvaluationReport, env_steps: int, train_iterations: int,
               wall_time: float, record: Callable[[EvaluationResult], None],
               env_kwargs: dict[str, Any] | None = None) -> EvaluationResult:
        """Summarise a report the coordinator has checked and keep it; `record` writes it to
        the run's logger, which the coordinator owns; `env_kwargs` are the commander's env
        settings the evaluation ran with (its `score` ranks it by them)."""
        det = summarise_episodes(req.deterministic)
        sto = summarise_episodes(req.stochastic) if req.stochastic else None
        result = EvaluationResult(
            task_id=req.task_id, worker_id=req.worker_id, policy_version=req.policy_version,
            env_steps=env_steps, train_iterations=train_iterations,
            episodes=det.episodes, return_mean=det.return_mean, return_std=det.return_std,
            length_mean=det.length_mean, wall_time=wall_time, success_rate=det.success_rate,
            deterministic=det, stochastic=sto, battles=battle_rates(req.battles),
            seq=self.total + 1)
        if req.video is not None:
            result.video = self._keep_video(result, req.video.fps)
        self.tasks.end(req.task_id, TaskState.FINISHED)
        self.total += 1
        self.evaluations.append(result)
        record(result)
        # The run's result: the policy that solved it, else the best-scored so far (by mean
        # return, unless the commander scores evaluations).
        solving = self._solves is not None and self._solves(result) is not None
        score = (result.return_mean if self._score is None
                 else self._score(result, env_kwargs or {}))
        if solving or (score is not None and (self.best_score is None
                                              or score > self.best_score)):
            self.best_evaluation, self.best_score = result, score
            self._keep_best_policy(result)
        self.forget_evaluated(result.task_id)
        log.info("evaluation of policy %d at %d env steps: %.1f +- %.1f%s%s%s",
                 result.policy_version, result.env_steps, result.return_mean,
                 result.return_std, "" if not det.truncated
                 else f", {det.truncated} of {det.episodes} truncated",
                 "" if result.success_rate is None
                 else f", success {result.success_rate:.2f}", "".join(
                     f"; vs {k} {v['win']:.2f}/{v['draw']:.2f}/{v['loss']:.2f}"
                     for k, v in result.battles.items() if "/" not in k))
        return result

    def _keep_best_policy(self, result: EvaluationResult) -> None:
        """Keep the weights of the best-evaluated policy as `best_policy` in storage (and
        `best_policy.safetensors` in the run directory): they are the run's result. The
        collector stored what it evaluated under `evaluated-<task id>`, because published
        versions are pruned long before an evaluation ends."""
        try:
            blob = self.storage.get_blob(evaluated_blob(result.task_id))
            if blob is None:
                log.warning("no weights stored for evaluation %s; best policy not updated",
                            result.task_id)
                return
            self.storage.put_blob("best_policy", blob)
        except Exception:  # storage trouble must not fail the evaluation report
            log.exception("could not keep the policy of evaluation %s", result.task_id)
            return
        self.best_policy_version = result.policy_version
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.run_dir / "best_policy.safetensors.tmp"
            tmp.write_bytes(blob)
            tmp.replace(self.run_dir / "best_policy.safetensors")

    def page(self, since: int, limit: int) -> EvaluationList:
        """The evaluations after `since` (a `seq`), oldest first, at most `limit`; those
        that fell out of the window are counted in `missed`."""
        held = list(self.evaluations)  # a copy: reports append from other threads
        oldest = held[0].seq if held else self.total + 1
        start = max(0, since + 1 - oldest)
        page = held[start:start + limit]
        return EvaluationList(evaluations=page, total=self.total,
                              next=page[-1].seq if page else max(since, oldest - 1),
                              missed=max(0, oldest - 1 - since),
                              more=start + limit < len(held))

    def _keep_video(self, result: EvaluationResult, fps: int) -> str | None:
        """The evaluation's video from storage to `<run-dir>/videos/` and the run's logger;
        its path relative to the run dir. Trouble is logged, never raised: a video must not
        fail the evaluation it shows."""
        if self.run_dir is None:
            return None
        try:
            mp4 = self.storage.get_blob(video_blob(result.task_id))
            gif = self.storage.get_blob(video_gif_blob(result.task_id))
            if mp4 is None:
                log.warning("evaluation %s reported a video that is not in storage",
                            result.task_id)
                return None
            rel = Path(VIDEO_DIR) / (f"eval-{result.seq:05d}-v{result.policy_version}-"
                                     f"{result.env_steps}.mp4")
            path = self.run_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(mp4)
            tmp.replace(path)
        except Exception:
            log.exception("could not keep the video of evaluation %s", result.task_id)
            return None
        if self._show_video is not None:
            self._show_video("eval/video", result.env_steps, path, gif, fps)
        return rel.as_posix()

    def forget_evaluated(self, task_id: str) -> None:
        """Delete the weights (and video) an evaluation stored: once reported, and when it
        failed or was cut short (its report will never come, and nothing else would delete
        them)."""
        for blob in (evaluated_blob(task_id), video_blob(task_id), video_gif_blob(task_id)):
            try:
                self.storage.delete_blob(blob)
            except Exception:  # an orphaned blob is harmless; logged for the operator
                log.exception("could not delete %s of evaluation %s", blob, task_id)

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> SavedEvaluations:
        """The schedule's part of the coordinator's snapshot."""
        return SavedEvaluations(
            next_eval_at=self.next_eval_at, next_eval_iteration=self.next_eval_iteration,
            best_policy_version=self.best_policy_version,
            # a copy first (one C call): reports append from request threads while the
            # snapshot thread is here
            evaluations=list(self.evaluations), evaluations_total=self.total,
            best_evaluation=self.best_evaluation, best_score=self.best_score)

    def restore(self, saved: SavedEvaluations) -> None:
        """The inverse of `snapshot()`."""
        if saved.next_eval_at is not None:
            self.next_eval_at = saved.next_eval_at
        self.next_eval_iteration = saved.next_eval_iteration
        self.best_policy_version = saved.best_policy_version
        self.total = saved.evaluations_total
        self.evaluations.extend(saved.evaluations)
        if saved.best_evaluation is not None:
            self.best_evaluation, self.best_score = saved.best_evaluation, saved.best_score

    def rerun(self, rec: TaskRecord, env_steps: int, train_iterations: int) -> None:
        """An evaluation restored from a snapshot: its report would find no one, so it
        fails and a new one falls due at once."""
        self.tasks.end(rec.task_id, TaskState.FAILED, "coordinator restarted")
        self.forget_evaluated(rec.task_id)
        self.next_eval_at = min(self.next_eval_at, env_steps)
        self.next_eval_iteration = min(self.next_eval_iteration, train_iterations)
