"""The local cluster: `rlfleet up` and `rlfleet resume` run every role as a process of this
machine. `launcher.up` takes one `LaunchOptions` (`options.py`: what the command line or the
Python API asked for) and wires the parts: the plan (what to start, on a `RunConfig`), the
supervisor (children, restarts, signals), the progress display, the watch over the run and
its summary; `forking` starts children as forks of the launcher where that is sound."""
