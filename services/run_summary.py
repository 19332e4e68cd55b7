"""`summary.json`, the outcome a run leaves in its directory, built one way whichever launcher
ran it: `rlfleet up` and `rlfleet resume` (`services/local/summary.py`) or a Slurm run's
coordinator job (`services/slurm/jobs.py`).

The figures the coordinator's last status gives are read here, once; each launcher adds what
only it knows (how the run ended for it, its clock, its counts, where it ran) and names the
keys it writes, in their order (`build_summary`). Tools and benchmarks read these files, so
each launcher's keys and their order stay put. `evaluations.json`, the coordinator's
evaluation history, is kept beside it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.http import HttpClient

SUMMARY_FILE = "summary.json"
EVALUATIONS_FILE = "evaluations.json"


def status_figures(status: dict | None) -> dict[str, Any]:
    """What the run's last status (`GET /api/v1/status`; None if it was never read) says of
    it, under summary.json's keys. `outcome` is how the run itself ended; a launcher that saw
    it end otherwise (interrupted, crashed) gives its own."""
    s = status or {}
    run = s.get("run", {})
    counters = s.get("counters", {})
    latest = s.get("latest_evaluation") or {}
    best = s.get("best_evaluation") or {}
    return {
        "solved": bool(run.get("solved", False)),
        "outcome": "solved" if run.get("solved") else "stopped",
        "stop_reason": run.get("stop_reason"),
        "eval_return": latest.get("return_mean"),
        "eval_return_std": latest.get("return_std"),
        "eval_stochastic_return": (latest.get("stochastic") or {}).get("return_mean"),
        "best_eval_return": best.get("return_mean"),
        # goal-conditioned envs (info["is_success"]); None for envs that report no success
        "eval_success_rate": latest.get("success_rate"),
        "best_eval_success_rate": best.get("success_rate"),
        "best_policy_version": best.get("policy_version"),
        "best_video": best.get("video"),
        "stop_value": run.get("stop_value"),
        "env_steps": counters.get("env_steps", 0),
        "train_iterations": counters.get("train_iterations", 0),
        "policy_version": counters.get("policy_version", -1),
        "chunks_accepted": counters.get("chunks_accepted", 0),
        "episodes": counters.get("episodes", 0),
        "run_seconds": run.get("wall_seconds"),
        "first_chunk_seconds": run.get("first_chunk_s"),
        "learner_group": s.get("learner_group"),
        "train": s.get("train", {}),
        # what went wrong quietly: NaN learner metrics, a learner starved of data
        "alerts": s.get("alerts", []),
        # batches handed to learners (the batch log's sample counts add up to these)
        "granted_batches": counters.get("granted_batches", 0),
    }


def build_summary(keys: Sequence[str], status: dict | None,
                  launcher: Mapping[str, Any]) -> dict[str, Any]:
    """summary.json's content: `keys` in their order, each the launcher's value where it
    gives one, else the status's (`status_figures`). A key neither gives, or one the launcher
    gives outside `keys`, is a launcher's mistake: `KeyError`."""
    stray = [key for key in launcher if key not in keys]
    if stray:
        raise KeyError(f"summary values without a key in the summary: {stray}")
    figures = {**status_figures(status), **launcher}
    return {key: figures[key] for key in keys}


def write_summary(run_dir: Path, summary: dict) -> Path:
    path = run_dir / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=2))
    return path


def write_evaluations(run_dir: Path, evaluations: list[dict]) -> None:
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
