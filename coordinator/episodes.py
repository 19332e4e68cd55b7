"""The episode table: every finished episode as one row of `<run-dir>/episodes.jsonl`.

Collectors already report each chunk's finished episodes (return, length, reward components,
and the env each ran in); the coordinator adds what only it knows (the collect task's seed,
the run's env step and wall time when the chunk was accepted) and writes one JSON line per
episode, flushed to the OS at once like `metrics.jsonl`, so a killed coordinator loses no row
it acknowledged. Evaluation episodes go in the same table with `evaluation: true`, and
`success` (goal-conditioned envs: reached its goal; null where the env reports no success).

A row is written when its chunk report is accepted, never when a restart replays the journal
(those rows were written the first time), so the table's training episodes add up to the
coordinator's `episodes` counter, until `logging.episodes_max_mb` is reached: the table then
rotates into time-named parts and drops its oldest rows (`shared/telemetry/rotating.py`), so
a run left for weeks cannot fill its disk. `rlfleet.shared.telemetry.rundata.load_run(run)
.episodes` reads the parts and the current file back as one pandas DataFrame.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from rlfleet.shared.contract.wire.evaluation import EvaluationReport
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.telemetry.rotating import SharedTable
from rlfleet.shared.telemetry.rundata import EPISODES_NAME

log = logging.getLogger("rlfleet.coordinator")


class EpisodeTable:
    """`max_bytes`: the table's files together stay within it (None: one file, no limit)."""

    def __init__(self, run: str, run_dir: Path | None, max_bytes: int | None = None) -> None:
        self.run = run
        self.rows_written = 0
        self._file: SharedTable | None = None
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            self._file = SharedTable(run_dir / EPISODES_NAME, max_bytes, "episode table")

    def on_chunks(self, worker_id: str, task_id: str, seed: int | None,
                  chunks: list[ChunkMeta], env_steps_after: int, wall_time: float) -> None:
        """Rows for the episodes of chunks just accepted: `env_steps_after` is the run's
        count with them, so each episode gets the count at the end of its chunk."""
        step = env_steps_after - sum(c.length for c in chunks)
        rows = []
        for c in chunks:
            step += c.length
            for i, (ret, length) in enumerate(zip(c.episode_returns, c.episode_lengths,
                                                  strict=True)):
                env = c.episode_envs[i] if c.episode_envs else None
                rows.append({
                    "run": self.run, "worker_id": worker_id, "task_id": task_id,
                    "env_index": env,
                    "seed": seed + env if seed is not None and env is not None else None,
                    "policy_version": c.policy_version, "return": ret, "length": length,
                    "return_components": (c.episode_return_components[i]
                                          if c.episode_return_components else None),
                    "wall_time": wall_time, "env_step": step, "evaluation": False})
        self._write(rows)

    def on_evaluation(self, req: EvaluationReport, seed: int | None, env_steps: int,
                      wall_time: float) -> None:
        """Rows for an evaluation's episodes, deterministic then stochastic."""
        rows = []
        for mode in ("deterministic", "stochastic"):
            episodes = getattr(req, mode)
            if episodes is None:
                continue
            successes = episodes.successes or [None] * len(episodes.returns)
            truncated = episodes.truncated or [None] * len(episodes.returns)
            for ret, length, success, cut in zip(episodes.returns, episodes.lengths,
                                                 successes, truncated, strict=True):
                rows.append({
                    "run": self.run, "worker_id": req.worker_id, "task_id": req.task_id,
                    "env_index": None, "seed": seed, "policy_version": req.policy_version,
                    "return": ret, "length": length, "return_components": None,
                    "wall_time": wall_time, "env_step": env_steps, "evaluation": True,
                    "deterministic": mode == "deterministic", "success": success,
                    "truncated": cut})
        self._write(rows)

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if self._file is None or not rows:
            return
        if self._file.write("".join(json.dumps(_finite(r)) + "\n" for r in rows)):
            self.rows_written += len(rows)  # flushed at once; a full disk fails no report

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN or infinity; the schemas already refuse them, this is the last guard."""
    ret = row["return"]
    if isinstance(ret, float) and not math.isfinite(ret):
        row["return"] = None
    return row
