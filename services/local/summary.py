"""What a run of `rlfleet up` leaves behind as it ends: `summary.json` (its outcome, its last
counters and evaluations, where start-up time went), `evaluations.json` (the coordinator's
evaluation history), and the closing line on the console. Tools and benchmarks read these
files, so their keys and their order stay put."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rlfleet.local.children import Child
from rlfleet.local.plan import Plan
from rlfleet.local.startup import Startup
from rlfleet.local.supervisor import RestartsExhausted
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.http import HttpClient, HttpError

SUMMARY_FILE = "summary.json"
EVALUATIONS_FILE = "evaluations.json"


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


def summarise(status: dict | None, ending: Ending, wall: float, plan: Plan,
              restarts: dict[str, int], startup: Startup) -> dict:
    """`summary.json`: the run's last status (`GET /api/v1/status`, None if it was never
    read), how it ended, and how long it took."""
    s = status or {}
    run = s.get("run", {})
    counters = s.get("counters", {})
    latest = s.get("latest_evaluation") or {}
    best = s.get("best_evaluation") or {}
    best_policy = plan.run_dir / "best_policy.safetensors"
    videos = sorted(p.relative_to(plan.run_dir).as_posix()
                    for p in (plan.run_dir / "videos").glob("*.mp4"))
    return {
        "solved": bool(run.get("solved", False)),
        "outcome": ending.outcome,
        "error": ending.error,
        "stop_reason": run.get("stop_reason"),
        "eval_return": latest.get("return_mean"),
        "eval_return_std": latest.get("return_std"),
        "eval_stochastic_return": (latest.get("stochastic") or {}).get("return_mean"),
        "best_eval_return": best.get("return_mean"),
        # goal-conditioned envs (info["is_success"]); None for envs that report no success
        "eval_success_rate": latest.get("success_rate"),
        "best_eval_success_rate": best.get("success_rate"),
        "best_policy_version": best.get("policy_version"),
        "best_policy": str(best_policy) if best_policy.exists() else None,
        # eval.video: every evaluation's video (videos/eval-<seq>-v<version>-<steps>.mp4)
        "videos": videos,
        "best_video": best.get("video"),
        "stop_value": run.get("stop_value"),
        "env_steps": counters.get("env_steps", 0),
        "train_iterations": counters.get("train_iterations", 0),
        "policy_version": counters.get("policy_version", -1),
        "chunks_accepted": counters.get("chunks_accepted", 0),
        "episodes": counters.get("episodes", 0),
        "wall_seconds": round(wall, 3),
        "run_seconds": run.get("wall_seconds"),
        "first_chunk_seconds": run.get("first_chunk_s"),
        "collectors": plan.collectors,
        "learners": plan.learners,
        "learner_group": s.get("learner_group"),
        "restarts": restarts,  # by child name: how often the launcher restarted it
        "seed": plan.config.seed,
        "storage": plan.storage,
        "config": plan.config_named,
        "algo": plan.config.algo.name,
        "train": s.get("train", {}),
        "env": plan.config.env.id,
        "crash": ending.crash,
        "first_chunk_s_from_launch": startup.first_chunk_s(),
        "startup_s": startup.figures(),
        # what went wrong quietly: NaN learner metrics, a learner starved of data
        "alerts": s.get("alerts", []),
        # batches handed to learners (the batch log's sample counts add up to these)
        "granted_batches": counters.get("granted_batches", 0),
    }


def write_summary(run_dir: Path, summary: dict) -> Path:
    path = run_dir / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=2))
    return path


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
    (run_dir / EVALUATIONS_FILE).write_text(json.dumps(evaluations, indent=2))


def evaluation_history(client: HttpClient) -> list[dict]:
    """The coordinator's evaluation history (`GET /api/v1/evaluations`), every page of it;
    raises `HttpError`."""
    evaluations: list[dict] = []
    since, more = 0, True
    while more:  # the coordinator answers a page at a time
        page = client.get(f"{API}/evaluations?since={since}&limit=1000")
        evaluations += page["evaluations"]
        since, more = page["next"], page["more"]
    return evaluations
