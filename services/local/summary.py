"""What a run of `rlfleet up` leaves behind as it ends: `summary.json` (its outcome, its last
counters and evaluations, where start-up time went; built as every launcher builds it,
`services/run_summary.py`), `evaluations.json` (the coordinator's evaluation history), and
the closing line on the console. Tools and benchmarks read these files, so their keys and
their order stay put."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from rlfleet.local.children import Child
from rlfleet.local.plan import Plan
from rlfleet.local.startup import Startup
from rlfleet.local.supervisor import RestartsExhausted
from rlfleet.run_summary import build_summary, evaluation_history, write_evaluations
from rlfleet.run_summary import write_summary as write_summary  # the launcher's, re-exported
from rlfleet.shared.infra.http import HttpClient, HttpError


@dataclass(frozen=True)
class Ending:
    """How a run ended: `summary.json`'s outcome and the launcher's exit code."""

    outcome: str = "stopped"  # solved, stopped, interrupted or crashed
    code: int = 3
    error: str | None = None
    crash: dict | None = None  # the error a child died of, when that ended the run

    @classmethod
    def stopped(cls, solved: bool) -> Ending:
        return cls("solved", 0) if solved else cls("stopped", 3)

    @classmethod
    def interrupted(cls) -> Ending:
        return cls("interrupted", 130, "interrupted by signal")

    @classmethod
    def crashed(cls, err: Exception) -> Ending:
        crash = None
        if isinstance(err, RestartsExhausted) and err.crash is not None:
            crash = {"child": err.child.name, "exit_code": err.child.proc.returncode,
                     **err.crash}
        return cls("crashed", 1, str(err), crash)


# summary.json's keys, in the order tools and benchmarks have read them.
SUMMARY_KEYS = (
    "solved", "outcome", "error", "stop_reason", "eval_return", "eval_return_std",
    "eval_stochastic_return", "best_eval_return", "eval_success_rate",
    "best_eval_success_rate", "best_policy_version", "best_policy", "videos", "best_video",
    "stop_value", "env_steps", "train_iterations", "policy_version", "chunks_accepted",
    "episodes", "wall_seconds", "run_seconds", "first_chunk_seconds", "collectors", "learners",
    "learner_group", "restarts", "seed", "storage", "config", "algo", "train", "env", "crash",
    "first_chunk_s_from_launch", "startup_s", "alerts", "granted_batches",
)


def summarise(status: dict | None, ending: Ending, wall: float, plan: Plan,
              restarts: dict[str, int], startup: Startup) -> dict:
    """`summary.json`: the run's last status (`GET /api/v1/status`, None if it was never
    read), how it ended, and how long it took."""
    best_policy = plan.run_dir / "best_policy.safetensors"
    videos = sorted(p.relative_to(plan.run_dir).as_posix()
                    for p in (plan.run_dir / "videos").glob("*.mp4"))
    return build_summary(SUMMARY_KEYS, status, {
        "outcome": ending.outcome,
        "error": ending.error,
        "best_policy": str(best_policy) if best_policy.exists() else None,
        # eval.video: every evaluation's video (videos/eval-<seq>-v<version>-<steps>.mp4)
        "videos": videos,
        "wall_seconds": round(wall, 3),
        "collectors": plan.collectors,
        "learners": plan.learners,
        "restarts": restarts,  # by child name: how often the launcher restarted it
        "seed": plan.config.seed,
        "storage": plan.storage,
        "config": plan.config_named,
        "algo": plan.config.algo.name,
        "env": plan.config.env.id,
        "crash": ending.crash,
        "first_chunk_s_from_launch": startup.first_chunk_s(),
        "startup_s": startup.figures(),
    })


def closing_line(path: Path, summary: dict) -> str:
    """The launcher's last line: where the summary is, and its main figures."""
    return (f"summary: {path}: solved={summary['solved']} "
            f"eval_return={_fmt(summary['eval_return'])} env_steps={summary['env_steps']} "
            f"wall_seconds={summary['wall_seconds']:.1f}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def save_evaluations(coordinator: Child | None, run_dir: Path) -> None:
    """Keep the coordinator's evaluation history (`GET /api/v1/evaluations`, the newest 500)
    in `<run-dir>/evaluations.json` before it stops: time-to-threshold figures need it."""
    if coordinator is None or coordinator.proc.poll() is not None:
        return
    client = HttpClient(coordinator.url, timeout_s=5, retries=1)
    try:
        evaluations = evaluation_history(client)
    except HttpError as err:
        print(f"evaluation history not saved: {err}", file=sys.stderr)
        return
    finally:
        client.close()
    write_evaluations(run_dir, evaluations)
