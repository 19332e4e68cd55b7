"""What every suite shares: the slow suites report each test as it ends, and their longest
modules start first.

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


# `make test` runs the slow suites on two workers, a module to a worker
# (`--dist loadscope --no-loadscope-reorder`), handing out modules in collection order. These
# take minutes each, so they go first, the longest first, and the two workers end together
# instead of one running the soak alone at the end. The compose suite comes after the others
# that need the machine: CI builds its image in the background until then.
LONG_MODULES = (
    "tests/integration/test_soak.py",
    "tests/integration/test_benches.py",
    "tests/slurm/test_slurm.py",
    "tests/netns/test_hosts_apart.py",
    "tests/compose/test_compose.py",
    "tests/integration/test_apex.py",
    "tests/integration/test_offline.py",
    "tests/integration/test_r2d2.py",
    "tests/chaos/test_chaos.py",
    "tests/chaos/test_learner_group.py",
    "tests/integration/test_python_api.py",
    "tests/integration/test_atari.py",
    "tests/slurm/test_slurm_bench.py",
    "tests/compose/test_compose_bench.py",
    # a minute or so each: after the longest, before the many short ones that fill the gaps
    "tests/integration/test_wheel.py",
    "tests/integration/test_resume.py",
    "tests/integration/test_run_health.py",
    "tests/integration/test_crash.py",
    "tests/integration/test_scale.py",
    "tests/integration/test_mujoco.py",
    "tests/integration/test_checkpoint_tools.py",
    "tests/integration/test_algorithms.py",
    "tests/integration/test_her.py",
    "tests/integration/test_learner_group.py",
    "tests/integration/test_notebook.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long modules first, in `LONG_MODULES`' order; every other test keeps its place
    after them, and each module its own order."""
    rank = {module: i for i, module in enumerate(LONG_MODULES)}

    def key(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0], len(LONG_MODULES))

    items.sort(key=key)  # stable: the rest keep collection order
