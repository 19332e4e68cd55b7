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

from rlfleet.shared.telemetry.rotating import table_files

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


EPISODES_NAME = "episodes.jsonl"
EPISODE_COLUMNS = ("run", "worker_id", "task_id", "env_index", "seed", "policy_version",
                   "return", "length", "return_components", "wall_time", "env_step",
                   "evaluation")


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL table, skipping a truncated last line (a killed writer)
    and garbled lines with a warning; nothing for a missing file."""
    if not path.is_file():
        return
    with path.open("rb") as f:
        lines = f.read().split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            log.warning("%s:%d: not a row, skipped: %.80r", path, i + 1, line)
            continue
        yield row


BATCH_LOG_NAME = "batch_log.jsonl"
SAMPLES_NAME = "samples.jsonl"
SAMPLE_KEY = ["buffer", "buffer_clears", "item_id"]  # one replay item for the whole run
SAMPLE_COLUMNS = (*SAMPLE_KEY, "times_sampled", "first_iteration", "last_iteration")
LOGGED_COLUMNS = ("worker_id", "train_iteration", "env_step", "wall_time", *SAMPLE_KEY)


def _pandas(what: str) -> Any:
    try:
        import pandas as pd
    except ImportError as err:
        raise ImportError(f"load_run(...).{what} needs pandas: pip install "
                          "'rlfleet[tables]'") from err
    return pd


def _lines(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """A columnar table's lines (each a dict of equal-length lists and scalars), its rotated
    parts first; lines whose lists differ in length are skipped with a warning."""
    out = []
    for path in table_files(run_dir, name):
        for row in read_rows(path):
            ids = row.get("item_id")
            if not isinstance(ids, list) or any(
                    isinstance(v, list) and len(v) != len(ids) for v in row.values()):
                log.warning("%s: a line whose columns differ in length, skipped", path)
                continue
            out.append(row)
    return out


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

    @property
    def episodes(self) -> Any:
        """The run's episode table (`episodes.jsonl`, written by the coordinator) as a pandas
        DataFrame, one row per finished episode: training episodes, and evaluation episodes
        (`evaluation` true). Reward components become `return_0`, `return_1`, ... columns.
        A table that rotated (`logging.episodes_max_mb`) is read from its parts, oldest
        first, then from the current file. Needs pandas (the `tables` extra); a run without
        the table gives an empty frame."""
        try:
            import pandas as pd
        except ImportError as err:
            raise ImportError("load_run(...).episodes needs pandas: pip install "
                              "'rlfleet[tables]'") from err
        rows = [row for path in table_files(self.run_dir, EPISODES_NAME)
                for row in read_rows(path)]
        frame = pd.DataFrame(rows, columns=list(EPISODE_COLUMNS) if not rows else None)
        if "return_components" in frame and frame["return_components"].notna().any():
            parts = pd.DataFrame(frame["return_components"].dropna().tolist(),
                                 index=frame["return_components"].dropna().index)
            frame = frame.join(parts.add_prefix("return_"))
        return frame.drop(columns=["return_components"], errors="ignore")

    @property
    def batch_log(self) -> Any:
        """The batch log's per-sample values (`logging.batch_log`; batch_log.jsonl) as a
        pandas DataFrame, one row per logged sample: who logged it, at which train
        iteration and env step, the item (buffer, buffer_clears, item_id), and one column
        per logged value (NaN where a value was not finite or not logged that update)."""
        pd = _pandas("batch_log")
        frames = []
        for row in _lines(self.run_dir, BATCH_LOG_NAME):
            n = len(row["item_id"])
            columns = {k: [row.get(k)] * n for k in LOGGED_COLUMNS if k != "item_id"}
            columns["item_id"] = row["item_id"]
            logged = row.get("values")
            values = logged if isinstance(logged, dict) else {}
            for name, column in values.items():
                if isinstance(column, list) and len(column) == n:
                    columns[name] = [np.nan if v is None else v for v in column]
            frames.append(pd.DataFrame(columns))
        if not frames:
            return pd.DataFrame(columns=list(LOGGED_COLUMNS))
        return pd.concat(frames, ignore_index=True)

    @property
    def samples(self) -> Any:
        """The unique-samples table (`logging.batch_log`; samples.jsonl) as a pandas
        DataFrame, one row per replay item handed to a learner: how many times it was, its
        first and last train iteration, and, for each per-sample value of the batch log,
        the value last logged for it (NaN: never logged) with `times_logged`. Rows that a
        flush wrote for the same item are added up here."""
        pd = _pandas("samples")
        parts = [pd.DataFrame({k: row[k] if isinstance(row.get(k), list)
                               else [row.get(k)] * len(row["item_id"])
                               for k in SAMPLE_COLUMNS})
                 for row in _lines(self.run_dir, SAMPLES_NAME)]
        if not parts:
            return pd.DataFrame(columns=list(SAMPLE_COLUMNS))
        table = (pd.concat(parts, ignore_index=True).groupby(SAMPLE_KEY, as_index=False)
                 .agg(times_sampled=("times_sampled", "sum"),
                      first_iteration=("first_iteration", "min"),
                      last_iteration=("last_iteration", "max")))
        logged = self.batch_log
        if len(logged):
            names = [c for c in logged.columns if c not in LOGGED_COLUMNS]
            last = (logged.sort_values("train_iteration", kind="stable")
                    .groupby(SAMPLE_KEY, as_index=False)
                    .agg(times_logged=("item_id", "size"),
                         **{n: (n, "last") for n in names}))
            table = table.merge(last, on=SAMPLE_KEY, how="left")
            table["times_logged"] = table["times_logged"].fillna(0).astype("int64")
        return table.sort_values(SAMPLE_KEY, ignore_index=True)

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
