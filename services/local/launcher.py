"""`rlfleet up`: a whole cluster as local processes, watched until it solves, fails or is
interrupted; `rlfleet resume` is the same with a run directory to continue.

Each role is its own process running the same `rlfleet <role>` command a container runs, on a
free loopback port. `up` wires the pieces, each in a module of its own:

- `plan.py`: what to start (the resolved config, run directory, storage, counts, port),
  checked and written to the run directory before anything starts;
- `supervisor.py`: the children, started at once (the first ones forked from this process,
  which has imported what they need: `children.py`, `forking.py`), restarted with a back-off
  when they exit on their own, scaled to the run's wish and stopped in order; stop signals;
- `watch.py` and `progress.py`: the run's status read until it ends, and shown;
- `summary.py` and `startup.py`: what the run leaves behind (`summary.json`).

The launcher never runs a torch operation (`precheck.py` builds plug-ins in a child) and
starts no thread before its first children are forked: forks of a process with either are
unsound. It imports torch, unused, before it forks the first learner or collector, so that
they share one import (`forking.py`).
"""

from __future__ import annotations

import time

from rlfleet.local.children import Child, ChildFailed
from rlfleet.local.children import die_with_parent as _die_with_parent
from rlfleet.local.options import LaunchOptions
from rlfleet.local.plan import make_plan
from rlfleet.local.precheck import check_config
from rlfleet.local.progress import Progress
from rlfleet.local.startup import Startup
from rlfleet.local.summary import Ending, closing_line, save_evaluations, summarise, write_summary
from rlfleet.local.supervisor import LocalCluster, RestartsExhausted, StopSignals, crash_report
from rlfleet.local.watch import Watch, wish_collectors

# What scripts and tests import from here.
__all__ = ["Child", "ChildFailed", "LaunchOptions", "LocalCluster", "RestartsExhausted",
           "_die_with_parent", "check_config", "up"]


def up(options: LaunchOptions) -> int:
    """`rlfleet up`, or `rlfleet resume` where `options.resume` is set; the exit code: 0
    solved, 3 stopped unsolved, 1 crashed, 130 interrupted (2, before anything starts, for a
    config that cannot run)."""
    startup = Startup(first_chunk=not options.resume)
    signals = StopSignals.from_environment()  # before the children copy the environment
    plan = make_plan(options)
    startup.mark("config_checked")
    cluster = LocalCluster(plan.config_path, plan.run_dir, plan.storage,
                           collector_nice=plan.collector_nice, resume=plan.resume,
                           max_restarts=plan.max_restarts, fork=True)
    started = time.monotonic()
    progress = Progress(quiet=options.quiet)  # prints nothing (imports no rich) before the forks
    signals.install()
    watch = Watch(cluster, progress, signals, startup)
    ending = Ending()
    try:
        cluster.start(plan.learners, plan.collectors, plan.port)
        progress.say(plan.headline())
        coordinator = cluster.wait_coordinator()
        startup.mark("coordinator_answered")
        progress.say(f"dashboard: {coordinator.url}/  (status: rlfleet status --coordinator "
                     f"{coordinator.url})")
        if plan.replaces_wish:
            wish_collectors(coordinator.url, plan.collectors)
        ending = watch.run(started)
    except ChildFailed as err:
        ending = Ending.crashed(err)
        progress.say(crash_report(err, cluster.max_restarts, progress.escape))
    finally:
        signals.restore()
        save_evaluations(cluster.coordinator, plan.run_dir)
        cluster.stop_workers()
        watch.settle(ending)
        cluster.shutdown()
    summary = summarise(watch.status, ending, time.monotonic() - started, plan,
                        dict(cluster.restarts), startup)
    progress.say(closing_line(write_summary(plan.run_dir, summary), summary))
    return ending.code
