"""Reading a run's `metrics.jsonl` back, for plots and post-processing.

Per scope, every record becomes one row of aligned float arrays: "step", "wall_time" and each
key the scope ever logged (NaN where a record lacks it). A run killed mid-write leaves a
truncated last line; it is skipped with a warning, as is any other line that is not a record.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("rlfleet.rundata")

JSONL_NAME = "metrics.jsonl"
RESERVED = ("scope", "step", "wall_time")


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a metrics.jsonl in file order; lines that are not a JSON object with
    a string "scope" and an integer "step" are skipped with a warning."""
    with path.open("rb") as f:
        lines = f.read().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not (isinstance(record, dict) and isinstance(record.get("scope"), str)
                and isinstance(record.get("step"), int)):
            what = "truncated last line" if i == last else "garbled line"
            log.warning("%s:%d: %s skipped: %.80r", path, i + 1, what, line)
            continue
        yield record


@dataclass
class RunData:
    run_dir: Path
    scopes: dict[str, dict[str, np.ndarray]]

    def keys(self) -> list[str]:
        """Every metric key of the run (any scope), sorted; not "step" or "wall_time"."""
        return sorted({k for cols in self.scopes.values() for k in cols
                       if k not in ("step", "wall_time")})

    def __contains__(self, key: object) -> bool:
        return any(key in cols for cols in self.scopes.values()) and key not in RESERVED

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(steps, values, wall_times) of the records that have `key`, from whichever scopes
        logged it, ordered by step. An unknown key is a KeyError (a typo must not plot an
        empty curve); test `key in run` first for optional metrics."""
        if key not in self:
            raise KeyError(f"{key!r} is not a metric of run {self.run_dir}; it has "
                           f"{', '.join(self.keys()) or 'none'}")
        parts = []
        for cols in self.scopes.values():
            if key in cols:
                has = ~np.isnan(cols[key])
                parts.append((cols["step"][has], cols[key][has], cols["wall_time"][has]))
        steps, values, walls = (np.concatenate(p) for p in zip(*parts, strict=True))
        order = np.argsort(steps, kind="stable")
        return steps[order], values[order], walls[order]


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def load_run(run_dir: Path | str) -> RunData:
    """The run in `run_dir`, from its metrics.jsonl (FileNotFoundError if there is none)."""
    run_dir = Path(run_dir)
    path = run_dir / JSONL_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file {path}: was this run logged with "
                                "logging.jsonl enabled?")
    rows: dict[str, list[dict[str, Any]]] = {}
    for record in read_records(path):
        rows.setdefault(record["scope"], []).append(record)
    scopes: dict[str, dict[str, np.ndarray]] = {}
    for scope, records in rows.items():
        keys = dict.fromkeys(k for r in records for k in r if k != "scope")
        scopes[scope] = {k: np.array([_float(r.get(k, np.nan)) for r in records],
                                     dtype=np.float64) for k in keys}
        scopes[scope].setdefault("wall_time", np.full(len(records), np.nan))
    return RunData(run_dir=run_dir, scopes=scopes)
