"""The learner group: this learner's rank in a generation (its process group and the
collectives over it) and its session, generation after generation."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from rlfleet.shared.util.imports import RlfleetDeprecationWarning


def __getattr__(name: str) -> Any:
    """`rlfleet.learner.group` was one module (`member.py` now): its names still resolve
    here, with a warning."""
    member = importlib.import_module("rlfleet.learner.group.member")
    if name.startswith("__") or name not in vars(member):
        raise AttributeError(f"module 'rlfleet.learner.group' has no attribute {name!r}")
    warnings.warn(f"rlfleet.learner.group.{name} moved: import it from "
                  "rlfleet.learner.group.member", RlfleetDeprecationWarning, stacklevel=2)
    return vars(member)[name]
