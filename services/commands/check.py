"""`rlfleet check`: a config loaded and what it names built, as a run would build it."""

from __future__ import annotations

import argparse

from rlfleet.commands.arguments import overrides_option
from rlfleet.shared.run.config import load_config


def cmd_check(args: argparse.Namespace) -> int:
    """Build what a config names (its env and its policy, torch and the user's code
    included): `rlfleet up` runs this in a child when a config names code by import path, so
    the launcher itself never runs that code, nor a torch operation."""
    from rlfleet.shared.run.check import check_runnable, describe_policy_class

    cfg = load_config(args.config, args.overrides)
    checked = check_runnable(cfg)
    if cfg.logging.writers:
        from rlfleet.shared.telemetry.plugins import check_writers

        check_writers(cfg.logging)
    if checked.policy_class is not None:
        print(describe_policy_class(checked.policy_class))
        print(f"capabilities of the built policy: {', '.join(checked.capabilities) or 'none'}")
    for warning in checked.warnings:
        print(f"warning: {warning}")
    print(f"{args.config}: ok")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`rlfleet check`."""
    k = sub.add_parser("check", help="check a config: load it, build its env and its policy")
    k.add_argument("--config", required=True)
    overrides_option(k)
    k.set_defaults(func=cmd_check)
