"""The single-process runner: the cluster's own parts in one process.

`rlfleet single` runs the real coordinator (its Flask app, its scheduler, its replay), one
real collector and one real learner, each the service `rlfleet up` starts, as threads of
this process. They talk the control plane's HTTP as ever, through an in-process transport
(`rlfleet.shared.infra.inproc`: no socket), and share experience and policy versions through
directory storage in the run's directory. So hooks, commanders, evaluations, stop rules,
self-play, the batch log and every feature of the cluster work here with no second
implementation, and the cost-of-distribution benches (`bench/time_to_solve.py`,
`bench/selfplay.py`) compare the same code on both sides: processes talking over loopback
there, threads of one process here.

The runner reaches the roles only through their package roots (`rlfleet.coordinator`,
`rlfleet.collector`, `rlfleet.learner`). One process means: no data process (the learner
samples on a thread of its own), one learner, one collector stepping all of `env.num_envs`.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlfleet.collector import CollectorService
from rlfleet.coordinator import Coordinator, create_app
from rlfleet.learner import LearnerService
from rlfleet.run_summary import build_summary, write_evaluations, write_summary
from rlfleet.shared.contract.wire.control import RunState
from rlfleet.shared.contract.wire.evaluation import EvaluationResult
from rlfleet.shared.contract.wire.views import MAX_EVALUATIONS_PER_PAGE, EvaluationList
from rlfleet.shared.infra import inproc
from rlfleet.shared.run.config import RunConfig, dump_config
from rlfleet.shared.worker import Turns, WorkerService, create_worker_app

log = logging.getLogger("rlfleet.single_process")

POLL_S = 0.2  # how often the runner looks at the run (evaluations, the stop flag)
CLOSE_TIMEOUT_S = 60.0  # for the workers' last version, checkpoint and report

# summary.json's keys for a single run, in the order tools have read them.
SUMMARY_KEYS = ("solved", "outcome", "eval_return", "stop_value", "env_steps",
                "train_iterations", "policy_version", "wall_seconds", "solved_s",
                "solved_env_steps", "eval_success_rate", "evaluations", "mode")


@dataclass
class SingleResult:
    solved: bool
    solved_195_s: float | None
    solved_195_env_steps: int | None
    eval_return: float | None
    env_steps: int
    train_iterations: int
    policy_version: int
    wall_seconds: float
    solved_s: float | None = None
    solved_env_steps: int | None = None
    games: int | None = None  # self-play: games played
    # envs that report info["is_success"]: the last evaluation's share of successes
    eval_success: float | None = None
    # env_steps, train_iterations, return (, success, stochastic_return, truncated, info/*)
    evaluations: list[dict] = field(default_factory=list)
    stop_reason: str | None = None
    # the coordinator's evaluation results as they are, as evaluations.json keeps them
    history: list[dict] = field(default_factory=list, repr=False)


def single_config(cfg: RunConfig) -> RunConfig:
    """What one process runs of `cfg`: the learner samples on a thread (no data process),
    alone, and workers are admitted from this process only."""
    return cfg.with_overrides(
        learner={**cfg.learner.model_dump(), "data_process": False, "count": 1},
        coordinator={**cfg.coordinator.model_dump(), "worker_networks": []})


def evaluation_record(e: EvaluationResult) -> dict[str, Any]:
    """One evaluation as `SingleResult.evaluations` keeps it."""
    out: dict[str, Any] = {"env_steps": e.env_steps, "train_iterations": e.train_iterations,
                           "return": e.return_mean}
    if e.success_rate is not None:
        out["success"] = e.success_rate
    if e.deterministic is not None:
        if e.deterministic.truncated is not None:
            out["truncated"] = e.deterministic.truncated
        out.update({f"info/{k}": v for k, v in e.deterministic.info.items()})
    if e.stochastic is not None:
        out["stochastic_return"] = e.stochastic.return_mean
    if e.battles:
        out["battles"] = e.battles
    return out


class InProcessCluster:
    """A coordinator, a collector and a learner served in this process under names of
    their own (several runs may share a process, one after the other)."""

    def __init__(self, cfg: RunConfig, run_dir: Path | None, storage: str) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.storage = storage
        self.tag = uuid.uuid4().hex[:8]
        self.names: list[str] = []
        self.workers: list[WorkerService] = []
        self.failure: str | None = None  # a worker that died of an error
        self.turns = Turns()  # the roles take turns at their heavy work
        self.app = create_app(cfg, storage, run_dir, start=True)
        self.coordinator: Coordinator = self.app.extensions["rlfleet"]
        self.url = self._serve("coordinator", self.app)

    def _serve(self, role: str, app: Any) -> str:
        name = f"{role}-{self.tag}"
        self.names.append(name)
        return inproc.serve(name, app)

    def start_workers(self) -> None:
        for role, service_class in (("collector", CollectorService),
                                    ("learner", LearnerService)):
            worker_id = f"{role}-{self.tag}"
            url = inproc.url_of(worker_id)
            service = service_class(self.url, url, worker_id, None, self.turns)
            service.on_fatal = lambda r=role: self._failed(r)
            self._serve(role, create_worker_app(service))
            self.workers.append(service.start())

    def _failed(self, role: str) -> None:
        self.failure = self.failure or f"the {role} stopped after a fatal error"

    def evaluations(self, since: int) -> EvaluationList:
        return self.coordinator.eval_schedule.page(since, MAX_EVALUATIONS_PER_PAGE)

    def close(self) -> dict[str, Any] | None:
        """Workers first (the learner's last version, checkpoint and report reach the
        coordinator), then the coordinator; its last status, read between the two."""
        closers = [threading.Thread(target=w.close, name="close", daemon=True)
                   for w in self.workers]
        for thread in closers:
            thread.start()
        for thread in closers:
            thread.join(CLOSE_TIMEOUT_S)
        status = self.coordinator.status().model_dump(mode="json")
        self.coordinator.close()
        for name in self.names:
            inproc.stop(name)
        return status


@contextmanager
def _run_dir(run_dir: Path | None) -> Iterator[tuple[Path | None, str]]:
    """The run directory (None: none, the run leaves nothing) and the storage inside it."""
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        yield run_dir, str(run_dir / "storage")
        return
    with tempfile.TemporaryDirectory(prefix="rlfleet-single-") as tmp:
        yield None, str(Path(tmp) / "storage")


class _Watch:
    """The run as the runner follows it: each evaluation as it is made, and when the run
    first reached 195 and its stop value, by the coordinator's clock (from its start to the
    evaluation's report: what `rlfleet up`'s summary counts as the run's seconds)."""

    def __init__(self, cfg: RunConfig, progress: Callable | None,
                 on_evaluation: Callable[[dict], None] | None) -> None:
        self.cfg = cfg
        self.progress = progress
        self.on_evaluation = on_evaluation
        self.since = 0
        self.records: list[dict] = []
        self.history: list[dict] = []
        self.last: EvaluationResult | None = None
        self.t195: tuple[float, int] | None = None
        self.solved_at: tuple[float, int] | None = None
        self.start = time.monotonic()
        self.stopped_s: float | None = None  # when the runner saw the run stop

    def read(self, cluster: InProcessCluster) -> None:
        page = cluster.evaluations(self.since)
        for e in page.evaluations:
            self.since = e.seq
            self.last = e
            record = evaluation_record(e)
            self.records.append(record)
            self.history.append(e.model_dump(mode="json"))
            if self.t195 is None and e.return_mean >= 195:
                self.t195 = (e.wall_time, e.env_steps)
            stop_value = self.cfg.eval.stop_value
            if self.solved_at is None and stop_value is not None \
                    and e.return_mean >= stop_value:
                self.solved_at = (e.wall_time, e.env_steps)
            if self.on_evaluation is not None:
                self.on_evaluation(record)
            if self.progress is not None:
                self.progress(e.env_steps, e.train_iterations, e.return_mean, e.wall_time)


def run_single(cfg: RunConfig, progress: Callable | None = None,
               run_dir: str | Path | None = None,
               should_stop: Callable[[], bool] | None = None,
               on_evaluation: Callable[[dict], None] | None = None) -> SingleResult:
    """Train `cfg` in this process until the run stops itself (solved, a budget) or
    `should_stop()` says so (a stop signal, the Python API's lifeline). `run_dir`: where the
    run leaves what `rlfleet up` leaves (None: nothing is kept). `progress(env_steps,
    train_iterations, return, seconds)` and `on_evaluation(record)` get each evaluation as
    it is made."""
    cfg = single_config(cfg)
    watch = _Watch(cfg, progress, on_evaluation)
    with _run_dir(Path(run_dir) if run_dir is not None else None) as (directory, storage):
        cluster = InProcessCluster(cfg, directory, storage)
        status = None
        try:
            cluster.start_workers()
            state = _follow(cluster, watch, should_stop)
        finally:
            status = cluster.close()
        # after the workers are gone: an evaluation under way when the run stopped is
        # recorded as it ends, while they close, and the summary must count it too
        watch.read(cluster)
    return _result(cfg, watch, state, status, time.monotonic() - watch.start)


def _follow(cluster: InProcessCluster, watch: _Watch,
            should_stop: Callable[[], bool] | None) -> RunState:
    """Follow the run until it stops (or is stopped); its last state. The runner reads the
    coordinator's object itself, a few times a second: a poll through its HTTP routes would
    cost the threads that train a share of the interpreter at every step."""
    coordinator, pause = cluster.coordinator, threading.Event()
    while not coordinator.stopped:
        watch.read(cluster)
        if cluster.failure is not None:
            raise RuntimeError(cluster.failure)
        if should_stop is not None and should_stop():
            coordinator.stop("stopped by request")
            break
        pause.wait(POLL_S)
    watch.stopped_s = time.monotonic() - watch.start
    return coordinator.run_state()


def _result(cfg: RunConfig, watch: _Watch, state: RunState | None,
            status: dict[str, Any] | None, wall: float) -> SingleResult:
    """The run's figures: its last evaluation, and the counters of the coordinator's last
    status (after the learner's last report)."""
    last = watch.last
    figures = build_summary(("solved", "env_steps", "train_iterations", "policy_version",
                             "stop_reason", "episodes"), status, {})
    solved = bool(figures["solved"])
    # solved by a stop value (the evaluation that reached it), or by a rule of the run's
    # own (a league's, a commander's): when the runner saw it stop
    solved_at = watch.solved_at or (None if watch.stopped_s is None or watch.last is None
                                    else (watch.stopped_s, watch.last.env_steps))
    games = None
    if cfg.league is not None and status is not None:
        games = int(figures["episodes"])  # a game is an episode of the learning side
    return SingleResult(
        solved=solved, solved_195_s=watch.t195[0] if watch.t195 else None,
        solved_195_env_steps=watch.t195[1] if watch.t195 else None,
        eval_return=last.return_mean if last else None,
        env_steps=int(figures["env_steps"]), train_iterations=int(figures["train_iterations"]),
        policy_version=int(figures["policy_version"]), wall_seconds=wall,
        solved_s=solved_at[0] if solved and solved_at else None,
        solved_env_steps=solved_at[1] if solved and solved_at else None,
        games=games, eval_success=last.success_rate if last else None,
        evaluations=watch.records, history=watch.history,
        stop_reason=figures["stop_reason"] or (state.stop_reason if state else None))


def train_in_dir(cfg: RunConfig, run_dir: Path, progress: Callable | None = None
                 ) -> tuple[SingleResult, str]:
    """`rlfleet single --run-dir DIR`: the run with everything `rlfleet up` leaves in a run
    directory (`config.yaml`, `metrics.jsonl`, TensorBoard's files, checkpoints, the best
    policy, `summary.json`), so that the Python API (`rlfleet.single(...)`) and the tools
    that read runs read it alike. A stop signal or the API's lifeline ends it in order,
    with its summary ("interrupted"). The result and its outcome: "solved", "stopped" (a
    budget ran out) or "interrupted"."""
    from rlfleet.stopping import StopSignals

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg.model_dump(mode="json")))
    signals = StopSignals.from_environment().install()
    try:
        res = run_single(cfg, progress, run_dir, should_stop=lambda: signals.received)
    finally:
        signals.restore()
    outcome = "solved" if res.solved else "interrupted" if signals.received else "stopped"
    summary = build_summary(SUMMARY_KEYS, None, {
        "solved": res.solved, "outcome": outcome, "eval_return": res.eval_return,
        "stop_value": cfg.eval.stop_value, "env_steps": res.env_steps,
        "train_iterations": res.train_iterations, "policy_version": res.policy_version,
        "wall_seconds": res.wall_seconds, "solved_s": res.solved_s,
        "solved_env_steps": res.solved_env_steps, "eval_success_rate": res.eval_success,
        "evaluations": len(res.evaluations), "mode": "single"})
    write_summary(run_dir, summary)
    write_evaluations(run_dir, res.history)
    return res, outcome


if __name__ == "__main__":  # quick manual runs: python -m rlfleet.single_process CONFIG [SEED]
    import sys

    from rlfleet.shared.run.config import load_config

    config = load_config(sys.argv[1])
    if len(sys.argv) > 2:
        config = config.with_overrides(seed=int(sys.argv[2]))
    result = run_single(config, progress=lambda s, i, r, t: print(
        f"{t:6.1f}s steps={s} it={i} eval={r:.1f}", flush=True))
    print(asdict(result))
