"""A role's last words: why it died, in a file its supervisor reads.

A process that dies of an error leaves its traceback in its log, which the launcher cannot
tell apart from the lines before it. So a role that dies of an exception also writes one
small JSON file (`RLFLEET_CRASH_FILE`, set per child by `rlfleet up`): the exception's type,
message and traceback, and where it happened ("collection", "evaluation evaluate-7",
"training", "start-up"). The launcher shows its last line at the first restart, and gives up
early when the same error comes back, with the whole of it in summary.json, instead of
restarting an env that always raises ten times over two minutes.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

from rlfleet.shared.infra.storage.credentials import redact

CRASH_FILE_ENV = "RLFLEET_CRASH_FILE"
TRACEBACK_CHARS = 20_000  # the end of a very deep traceback is the part that names the cause


def describe(err: BaseException) -> str:
    """`Type: message` on one line (a console line, a summary field), as Python's last
    traceback line says it for a one-line message."""
    message = " ".join(str(err).split())
    return f"{type(err).__name__}: {message}" if message else type(err).__name__


def write_crash(err: BaseException, role: str, where: str, worker_id: str | None = None,
                path: str | None = None) -> dict[str, Any] | None:
    """Record `err` in the crash file (`path`, or `RLFLEET_CRASH_FILE`); no file, nothing
    written. Never raises: a failure to record must not hide the crash itself."""
    path = path or os.environ.get(CRASH_FILE_ENV)
    if not path:
        return None
    tb = redact("".join(traceback.format_exception(type(err), err, err.__traceback__)))
    report = {"role": role, "worker_id": worker_id, "where": where,
              "type": type(err).__name__, "message": redact(str(err)),
              "error": redact(describe(err)), "traceback": tb[-TRACEBACK_CHARS:],
              "time": time.time()}
    try:
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(target)
    except OSError:
        return None
    return report


def read_crash(path: Path) -> dict[str, Any] | None:
    """The crash a child recorded, or None (it was killed, or exited without an error)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and "error" in report else None


def signature(report: dict[str, Any]) -> tuple[str, str, str]:
    """What makes two crashes "the same error": where (without the task's number), the
    exception's type and its message."""
    where = str(report.get("where", "")).split(" ")[0]
    return where, str(report.get("type")), str(report.get("message"))
