"""The process a run of the Python API runs in (`rlfleet.up(...)`, `rlfleet.single(...)`):
`python -m rlfleet.api_child RUN_DIR/api-options.json`.

The `Run` writes its command and options as JSON (`OPTIONS_FILE`, beside the run's other
files, where a person can read what it was started with); this entry point builds the typed
options object from it again and calls the launcher (or the single run) with it, as the
`rlfleet up` or `rlfleet single` command does once it has parsed its command line. Nothing
goes through argv or argparse, and the process ends as that command would: 2 and one line
for options or a config it refuses, which the `Run` raises as `ConfigError`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlfleet.command import CommandOptions, run_command

OPTIONS_FILE = "api-options.json"  # in the run directory: {"command": ..., "options": {...}}


def write_options(path: Path, command: str, options: CommandOptions) -> None:
    """What the child reads: `options` as JSON, under its command."""
    path.write_text(json.dumps({"command": command,
                                "options": options.model_dump(mode="json")}, indent=2))


def _starter(command: str, fields: dict[str, Any]) -> Callable[[], int]:
    """What runs `command` with `fields` (checked when it runs: a refusal is its exit 2)."""
    if command == "up":
        from rlfleet.commands.launch import launch
        from rlfleet.local.options import LaunchOptions

        return lambda: launch(LaunchOptions.checked(**fields))
    if command == "single":
        from rlfleet.commands.single import SingleOptions, train_single

        return lambda: train_single(SingleOptions.checked(**fields))
    raise ValueError(f"{command!r}: the Python API starts `up` or `single`")


def main(argv: list[str]) -> int:
    data = json.loads(Path(argv[0]).read_text())
    command = data["command"]
    return run_command(command, _starter(command, data["options"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
