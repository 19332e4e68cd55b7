"""What the coordinator shows of a run: the `/status` document, the flat scalars the
scheduler logs each tick, and the recent rates of env steps and train iterations.

Read-only over the coordinator's parts, so the request handlers in `service.py` stay about
changing state; a figure added for people to see goes here.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from rlfleet.shared.contract.schemas import Role, TaskKind

if TYPE_CHECKING:
    from rlfleet.coordinator.service import Coordinator


def buffer_metrics(buffers: dict[str, dict]) -> dict[str, float]:
    """Buffer stats as flat metrics, `buffer/<name>/<stat>` (numeric stats only)."""
    return {f"buffer/{name}/{key}": float(value) for name, stats in buffers.items()
            for key, value in stats.items() if isinstance(value, int | float)}


class Readout:
    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self._rates: deque[tuple[float, int, int]] = deque(maxlen=64)

    def sample_rates(self, now: float) -> None:
        """One point of the rate window (each scheduler tick)."""
        c = self.coord
        self._rates.append((now, c.env_steps, c.train_iterations))

    def info_scalars(self) -> dict[str, float]:
        """The `info` scope: buffers, counters and the cluster, flat."""
        c = self.coord
        with c._cond:
            buffers = c.replay.stats()
            ledger = c.replay.ledger(c.chunks_accepted)
            counters = {"env_steps": c.env_steps,
                        "frames": c.env_steps * c.cfg.env.frame_skip,
                        "train_iterations": c.train_iterations,
                        "policy_version": c.policy_version,
                        "chunks_accepted": c.chunks_accepted, "episodes": c.episodes}
        out = buffer_metrics(buffers)
        out.update({f"counters/{k}": float(v) for k, v in counters.items()})
        for key in ("acknowledged", "in_buffers", "evicted", "consumed"):
            out[f"ledger/{key}"] = float(ledger[key])
        out.update({f"ledger/dropped/{k}": float(v) for k, v in ledger["dropped"].items()})
        out["ledger/orphans_deleted"] = float(c.durability.orphans_deleted)
        for role in (Role.COLLECTOR, Role.LEARNER):
            out[f"cluster/{role.value}s_alive"] = float(len(c.members.alive(role)))
        active = [r for r in c.tasks.all() if r.active]
        out["cluster/tasks_active"] = float(len(active))
        for kind in TaskKind:
            out[f"cluster/tasks_{kind.value}"] = float(sum(r.kind is kind for r in active))
        out.update(c.group.scalars())
        if c.matchmaker is not None:
            out.update(c.matchmaker.scalars())
        return out

    def rates(self) -> tuple[float, float]:
        """env steps/s and train iterations/s over the last few seconds."""
        c = self.coord
        samples = [s for s in self._rates if s[0] >= c.clock() - 5.0]
        if len(samples) < 2:
            return 0.0, 0.0
        (t0, e0, i0), (t1, e1, i1) = samples[0], samples[-1]
        dt = max(t1 - t0, 1e-9)
        return (e1 - e0) / dt, (i1 - i0) / dt

    def _metrics(self, buffers: dict, returns: list[float], steps_per_s: float,
                 latest: dict | None) -> dict[str, float]:
        c = self.coord
        out = buffer_metrics(buffers)
        out["collect/env_steps_per_s"] = round(steps_per_s, 1)
        if returns:
            out.update({"collect/return_min": min(returns),
                        "collect/return_mean": float(np.mean(returns)),
                        "collect/return_max": max(returns),
                        "collect/episode_length": float(np.mean(c.recent_lengths))})
        out.update({f"train/{k}": v for k, v in c.learner_metrics.items()})
        for mode in ("deterministic", "stochastic"):
            summary = (latest or {}).get(mode)
            for key, value in (summary or {}).items():
                if value is not None:  # success_rate of an env without `is_success`
                    out[f"eval/{mode}/{key}"] = value
        return out

    def status(self) -> dict:
        c = self.coord
        now = c.clock()
        steps_per_s, iters_per_s = self.rates()
        evals = c.eval_schedule
        latest = evals.evaluations[-1].model_dump() if evals.evaluations else None
        best = evals.best_evaluation.model_dump() if evals.best_evaluation else None
        returns = list(c.recent_returns)
        with c._cond:
            buffers = c.replay.stats()
            ledger = c.replay.ledger(c.chunks_accepted)
            group = c.group.status(c.started_at)
        ledger.update(orphans_deleted=c.durability.orphans_deleted,
                      unannounced=c.durability.unannounced,
                      journal_generation=c.replay.generation)
        return {
            "run": {"name": c.cfg.name,
                    "state": ("stopped" if c.stopped else "paused" if c.paused
                              else "running"),
                    "paused": c.paused, "collectors_desired": c.collectors_desired,
                    "learners_desired": c.group.learners_desired,
                    "stop_reason": c.stop_reason, "solved": c.solved,
                    "wall_seconds": round((c.stopped_at or now) - c.started_at, 3),
                    "stop_value": c.cfg.eval.stop_value, "storage": c.storage_url,
                    # workers' start-up (imports, registration) ends here
                    "first_chunk_s": (round(c.first_chunk_at - c.started_at, 3)
                                      if c.first_chunk_at is not None else None)},
            "counters": {"env_steps": c.env_steps, "train_iterations": c.train_iterations,
                         "granted_batches": c.granted_batches,
                         "policy_version": c.policy_version,
                         "chunks_accepted": c.chunks_accepted, "episodes": c.episodes},
            "rates": {"env_steps_per_s": round(steps_per_s, 1),
                      "train_iterations_per_s": round(iters_per_s, 1)},
            "buffer": {"size": c.replay.size(), "chunks": len(c.replay.registry)},
            "buffers": buffers,
            # Flat scalars under the names the logger uses (`scope/...`).
            "metrics": self._metrics(buffers, returns, steps_per_s, latest),
            "collect": {"episode_return_mean": float(np.mean(returns)) if returns else None,
                        "episode_length_mean": (float(np.mean(c.recent_lengths))
                                                if returns else None)},
            "train": c.learner_metrics,
            "workers": [w.to_json(now) for w in c.members.all()],
            "tasks": [r.to_json() for r in c.tasks.all() if r.active],
            "latest_evaluation": latest,
            "best_evaluation": best,
            "ledger": ledger,
            "learner_group": group,
            "league": c.matchmaker.view() if c.matchmaker else None,
        }
