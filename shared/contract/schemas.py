"""Deprecated: the wire schemas live in `rlfleet.shared.contract.wire`, one module per part of
the conversation (`wire.experience.ChunkMeta`, `wire.sampling.SampleRequest`, ...).

This module stays so that code written against it still imports: each name resolves to the
class (or constant) of its new module, the very same object, and the first use of a name
in a process warns with `RlfleetDeprecationWarning`, naming the module to import it from.
Nothing in rlfleet imports it (a unit test holds to that).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from rlfleet.shared.util.imports import RlfleetDeprecationWarning

# Each module of `rlfleet.shared.contract.wire` and the names it took over from this one.
_MOVED: dict[str, tuple[str, ...]] = {
    "base": ("API", "Id", "MAX_COUNT", "Count", "Version", "Int64", "MAX_RETURN", "Return",
             "Finite", "SuccessRate", "JsonScalar", "EnvKwargs", "LevelSeeds", "Request",
             "Response", "Role", "WorkerState", "TaskKind", "TaskState", "ErrorBody"),
    "membership": ("GpuInfo", "SlurmPlacement", "WorkerResources", "RegisterRequest",
                   "RegisterResponse", "HeartbeatRequest", "HeartbeatResponse"),
    "group": ("StoreAddr", "GroupSyncRequest", "GroupAssignment"),
    "tasks": ("PlayerName", "Opponent", "GameRecord", "CollectTask", "LearnTask", "EvaluateTask",
              "Task", "TaskEnvelope", "TaskAccepted", "TaskResult"),
    "experience": ("ChunkMeta", "ChunkReport", "ChunkReportResponse", "CollectPermitRequest",
                   "CollectPermitResponse"),
    "sampling": ("MixShare", "MAX_SAMPLE_ITEMS", "sample_items", "SampleRequest", "SamplePart",
                 "SampleResponse", "PriorityUpdate", "Consumed", "HistogramData",
                 "MAX_LOGGED_SAMPLES", "MAX_LOGGED_ENTRIES", "MAX_SAMPLE_VALUES",
                 "SAMPLE_VALUE_PATTERN", "SampleValueName", "BatchLogEntry", "LearnInfo",
                 "LearnInfoResponse"),
    "evaluation": ("EvalMode", "success_rate", "EvalEpisodes", "BattleOutcome", "VideoReport",
                   "EvaluationReport", "EvalSummary", "EvaluationResult"),
    "control": ("ScaleRequest", "RunState"),
    "views": ("Health", "WorkerInfo", "WorkerList", "TaskInfo", "TaskList", "BufferStats",
              "BufferList", "BufferInfo", "BufferChunks", "BufferClearRequest", "BufferCleared",
              "BufferLoadRequest", "BufferLoaded", "MAX_EVALUATIONS_PER_PAGE", "EvaluationsQuery",
              "EvaluationList"),
    "status": ("RunInfo", "RunCounters", "RunRates", "ReplaySize", "CollectStats", "Ledger",
               "GroupRank", "GroupReformation", "LearnerGroupStatus", "LeaguePlayer", "Payoff",
               "LeagueSummary", "LeagueView", "Alert", "Status"),
    "records": ("MAX_RECORDS_PER_PAGE", "RecordsQuery", "LogRecord", "RecordsPage"),
}
MODULE_OF = {name: f"rlfleet.shared.contract.wire.{module}"
             for module, names in _MOVED.items() for name in names}
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    module = MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"{__name__} is deprecated: import {name} from {module}",
                      RlfleetDeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *MODULE_OF])
