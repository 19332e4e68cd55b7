"""Thread priorities: heavy imports run on a nicer thread while a cluster starts.

On a small machine a cluster's start is a fight for the cores: the coordinator's start, the
collectors' registration and their first chunks should get them before the CPU seconds of
importing torch that nothing needs yet. Linux sets niceness per thread, so a thread can
lower its own priority without touching the process's other threads; elsewhere, or where it
is not allowed, nothing changes.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

# How much nicer than the process an import of torch runs while a cluster starts.
IMPORT_NICE = 10


def nicer(steps: int = IMPORT_NICE) -> None:
    """Lower the calling thread's scheduling priority by `steps`."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid,
                       min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: the thread keeps the process's priority


def import_nicer(module: str, name: str, steps: int = IMPORT_NICE) -> Any:
    """`module.name`, imported on a thread `steps` nicer than this one; the calling thread
    waits for it, and an import error is raised here."""
    found: dict[str, Any] = {}

    def load() -> None:
        nicer(steps)
        try:
            found["value"] = getattr(importlib.import_module(module), name)
        except BaseException as err:  # raised again on the calling thread
            found["error"] = err

    thread = threading.Thread(target=load, name=f"import-{module}")
    thread.start()
    thread.join()
    if "error" in found:
        raise found["error"]
    return found["value"]
