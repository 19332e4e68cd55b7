"""Arguments several `rlfleet` sub-commands take alike: a config's `KEY=VALUE` overrides
after the options, and the checkpoint to act with instead of a run's best policy."""

from __future__ import annotations

import argparse

from rlfleet.command import NON_NEGATIVE
from rlfleet.roles import OVERRIDES_HELP


def overrides_option(p: argparse.ArgumentParser, help: str = OVERRIDES_HELP) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=help)


def checkpoint_option(p: argparse.ArgumentParser, help: str = (
        "act with the policy of the checkpoint at train iteration N (`rlfleet checkpoints "
        "RUN_DIR` lists them) instead of the best policy")) -> None:
    p.add_argument("--checkpoint", type=NON_NEGATIVE, default=None, metavar="N", help=help)
