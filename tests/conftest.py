"""What every suite shares: the slow suites report each test as it ends.

`make test` runs quietly (a dot a test), which for the unit tests is right. The integration,
chaos, netns and compose tests take seconds to minutes each: for them a line per test (its
name, outcome and time) shows what is running and where the time goes, instead of a dot
every few minutes.
"""

from __future__ import annotations

import pytest

SLOW_SUITES = ("tests/integration/", "tests/chaos/", "tests/netns/", "tests/compose/",
               "tests/slurm/")


@pytest.hookimpl(tryfirst=True)  # before the reporter's dot, so the line stands alone
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and not (report.when == "setup" and not report.passed):
        return
    if not report.nodeid.startswith(SLOW_SUITES):
        return
    reporter = _reporter()
    if reporter is not None and reporter.verbosity <= 0:  # -v prints names already
        if reporter._tw.width_of_current_line:  # after a row of dots: a line of its own
            reporter._tw.line()
        reporter.write_line(f"{report.nodeid} {report.outcome.upper()} "
                            f"({report.duration:.1f} s)")


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    """No dot for a slow test's call: its line above says it."""
    if (report.when == "call" and report.nodeid.startswith(SLOW_SUITES)
            and config.get_verbosity() <= 0):
        return report.outcome, "", report.outcome.upper()
    return None


_config: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def _reporter():
    return _config.pluginmanager.get_plugin("terminalreporter") if _config else None
