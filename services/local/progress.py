"""What `rlfleet up` shows while a run goes: its messages on stderr (rich markup) and one
progress line, live on a terminal, printed every 5 s to a pipe or a file, none with `--quiet`.

rich is imported when a `Progress` first prints, never with this module: the launcher's
first message comes once its first children are forked, so they neither wait for rich's
imports nor carry them. Lines are never cut at the console's width (80 columns when stderr
is a file or a pipe): paths and tracebacks stay whole in logs.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live

Say = Callable[[str], None]  # prints one line (rich markup) to the console

PRINT_EVERY_S = 5.0  # the progress line's period where it cannot be live


def progress_text(status: dict, elapsed: float) -> str:
    """One line of a run's status (`GET /api/v1/status`) after `elapsed` seconds."""
    c, r = status["counters"], status["rates"]
    ev = status.get("latest_evaluation")
    ev_txt = f"{ev['return_mean']:.1f}" if ev else "-"
    alive = sum(1 for w in status["workers"] if w["state"] == "alive"
                and w["role"] == "collector")
    group = status.get("learner_group") or {}
    learners = (f"  learners {group['world_size']} (gen {group['generation']})"
                if group.get("world_size", 1) > 1 else "")
    return (f"{elapsed:6.1f}s  env steps {c['env_steps']:>9,}  {r['env_steps_per_s']:>8,.0f}/s  "
            f"train it {c['train_iterations']:>8,}  policy v{c['policy_version']:<6}  "
            f"eval {ev_txt:>6}  collectors {alive}{learners}")


class Progress:
    """The launcher's console. `say` prints a message; `show` the progress line, in place
    while `live()` is entered on a terminal. Nothing of rich is imported before the first of
    them."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self._live: Live | None = None
        self._last_print = 0.0

    @functools.cached_property
    def console(self) -> Console:
        from rich.console import Console

        return Console(stderr=True, soft_wrap=True)

    def say(self, markup: str) -> None:
        self.console.print(markup)

    @staticmethod
    def escape(text: str) -> str:
        """`text` made safe to put inside markup."""
        from rich.markup import escape

        return escape(text)

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        """The live line, for as long as the watch loop runs (a terminal's only)."""
        if self.quiet or not self.console.is_terminal:
            yield
            return
        from rich.live import Live
        from rich.text import Text

        with Live(Text("starting..."), console=self.console, refresh_per_second=4,
                  transient=False) as live:
            self._live = live
            try:
                yield
            finally:
                self._live = None

    def show(self, status: dict, elapsed: float) -> None:
        line = progress_text(status, elapsed)
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(line))
        elif time.monotonic() - self._last_print >= PRINT_EVERY_S and not self.quiet:
            print(line, file=sys.stderr, flush=True)
            self._last_print = time.monotonic()
