"""`rlfleet single`: the cluster's own parts trained in one process (no ports, no child
processes), for a baseline and for hyperparameter trials. The command line and the Python API
(`rlfleet.single`) build the same `SingleOptions`; the training itself is
`rlfleet.single_process`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import Field

from rlfleet.command import CommandOptions, setup_logging
from rlfleet.commands.arguments import overrides_option
from rlfleet.shared.run.config import load_config


class SingleOptions(CommandOptions):
    """One run of `rlfleet single`, whether the command line or the Python API
    (`rlfleet.single`) started it."""

    config: str = Field(description="a YAML path or the name of a packaged config")
    overrides: tuple[str, ...] = Field((), description="`KEY=VALUE` items for the config")
    seed: int | None = None
    run_dir: str | None = Field(None, description="where to write what `rlfleet up` leaves "
                                "in a run directory; None: nowhere")


def single_options(args: argparse.Namespace) -> SingleOptions:
    """What `rlfleet single` was given."""
    return SingleOptions.checked(config=args.config, overrides=tuple(args.overrides),
                                 seed=args.seed, run_dir=args.run_dir)


def train_single(options: SingleOptions) -> int:
    """Train in this process; the exit code as `rlfleet up` ends: 0 solved, 3 stopped
    unsolved, 130 stopped by a signal."""
    from dataclasses import asdict

    from rlfleet.shared.run.check import check_runnable
    from rlfleet.single_process import run_single, train_in_dir

    setup_logging("single")
    cfg = load_config(options.config, options.overrides).with_overrides(seed=options.seed)
    if options.overrides:
        print(f"overrides: {' '.join(options.overrides)}", flush=True)
    for warning in check_runnable(cfg).warnings:
        print(f"warning: {warning}", file=sys.stderr)

    def progress(s: int, i: int, r: float, t: float) -> None:
        print(f"{t:7.1f}s env steps {s:>8,}  train it {i:>7,}  eval {r:7.1f}", flush=True)

    outcome = None
    if options.run_dir:
        res, outcome = train_in_dir(cfg, Path(options.run_dir), progress)
    else:
        res = run_single(cfg, progress=progress)
    print({k: v for k, v in asdict(res).items() if k != "history"})
    return 0 if res.solved else 130 if outcome == "interrupted" else 3


def cmd_single(args: argparse.Namespace) -> int:
    return train_single(single_options(args))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`rlfleet single`."""
    g = sub.add_parser("single", help="train in one process (baseline, hyperparameter trials)")
    g.add_argument("--config", required=True)
    overrides_option(g)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--run-dir", default=None, help="write what `rlfleet up` leaves in a run "
                   "directory (config.yaml, metrics.jsonl, summary.json) here")
    g.set_defaults(func=cmd_single)
