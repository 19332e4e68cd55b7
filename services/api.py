"""The Python API: a run started, watched and stopped from Python code (a notebook, a sweep
driven by Optuna or a W&B agent, a test), as `rlfleet up` and `rlfleet single` run from a shell.

    run = rlfleet.up("cartpole-dqn", collectors=2, overrides={"algo.lr": 3e-4})
    run.status()             # state, env steps, the latest evaluation
    run.wait(timeout=600)    # the summary once it ends (None if still running)
    run.metrics              # metrics.jsonl as a DataFrame (pandas), or its records
    run.stop()

Each run is the `rlfleet up` (or `rlfleet single`) command's work in a child process, never
threads of the caller: the launcher forks its roles, installs signal handlers and blocks, none
of which a notebook kernel or a worker thread may do. The child gets the run's options as the
typed object the command line builds (`LaunchOptions`, `SingleOptions`), written as JSON into
the run directory and read by `rlfleet.api_child`, which calls the launcher with them.

The child is tied to its `Run` and to this Python process by a lifeline, a pipe whose write
end only this process holds: when the `Run` is dropped, or the process ends however it ends
(a kernel killed or restarted included), the pipe closes and the launcher stops its run in
order (workers first, a summary written). Nothing depends on the thread that started the run
(`PR_SET_PDEATHSIG` follows the thread, so it is not used here), and no signal handler is
installed in this process.

The config and the options are checked here before anything starts, by the same models as
the command line's: a bad field raises `ConfigError` naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfleet.api_child import OPTIONS_FILE, write_options
from rlfleet.command import CommandOptions
from rlfleet.run_summary import SUMMARY_FILE
from rlfleet.shared.contract.config import ConfigError
from rlfleet.stopping import LIFELINE_ENV

LAUNCHER_LOG = "launcher.log"  # the child's own output, in the run directory
SOURCE_CONFIG = "source-config.yaml"  # a config given as a dict, as the child reads it
Overrides = Mapping[str, Any] | Iterable[str] | None
Config = str | Path | Mapping[str, Any]  # a YAML path, a packaged config's name, or the dict


@dataclass(frozen=True)
class RunStatus:
    """Where a run stands. `state`: "starting" (the coordinator does not answer yet),
    "running", then how it ended: "solved", "stopped" (a budget ran out, or `stop()`), "crashed".
    `detail` is the coordinator's whole status answer (`GET /api/v1/status`), or the summary
    once the run has ended."""

    state: str
    env_steps: int = 0
    train_iterations: int = 0
    policy_version: int = 0
    eval_return: float | None = None
    collectors: int = 0
    detail: dict[str, Any] = field(default_factory=dict, repr=False)


class Run:
    """One run in a child process of this one: `rlfleet.up(...)` or `rlfleet.single(...)`.
    It lives as long as this object and this process; `stop()` ends it sooner."""

    def __init__(self, kind: str, options: CommandOptions, run_dir: Path,
                 url: str | None) -> None:
        self.kind = kind  # "up" or "single"
        self.options = options  # what it was started with
        self.run_dir = run_dir
        self.url = url  # the coordinator's (the dashboard's); None for a single run
        self.log_path = run_dir / LAUNCHER_LOG
        options_path = run_dir / OPTIONS_FILE
        write_options(options_path, kind, options)
        read_end, write_end = os.pipe()
        env = {**os.environ, LIFELINE_ENV: str(read_end), "PYTHONUNBUFFERED": "1"}
        try:
            with self.log_path.open("ab") as log:
                # A process group of its own: a terminal's Ctrl-C meant for this Python (a
                # `wait()` interrupted) does not stop the run; `stop()` does.
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "rlfleet.api_child", str(options_path)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                    pass_fds=(read_end,), process_group=0)
        finally:
            os.close(read_end)
        # The write end: closed when this object is collected or this process exits.
        self._lifeline = weakref.finalize(self, os.close, write_end)

    def __repr__(self) -> str:
        state = "running" if self._proc.poll() is None else f"exited {self._proc.returncode}"
        return f"<rlfleet.Run {self.kind} {self.run_dir.name} ({state})>"

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The command's exit code once it ended (0 solved, 3 stopped unsolved, 1 crashed,
        130 stopped by `stop()`, 2 a config it refused); None while it runs."""
        return self._proc.poll()

    def running(self) -> bool:
        return self._proc.poll() is None

    @property
    def summary(self) -> dict[str, Any] | None:
        """`summary.json`: how the run ended and its figures; None until it has ended."""
        path = self.run_dir / SUMMARY_FILE
        if self.running() or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError:
            return None

    def status(self) -> RunStatus:
        """The run's state now: asked of its coordinator while it runs, read from its summary
        once it has ended."""
        if not self.running():
            return self._ended()
        if self.url is None:
            return self._single_status()
        from rlfleet.shared.infra.http import HttpClient, HttpError

        client = HttpClient(self.url, timeout_s=2, retries=0)
        try:
            s = client.get("/api/v1/status")
        except HttpError:
            return RunStatus("starting")
        finally:
            client.close()
        counters, latest = s.get("counters", {}), s.get("latest_evaluation") or {}
        run = s.get("run", {})
        state = "running" if run.get("state") != "stopped" else (
            "solved" if run.get("solved") else "stopped")
        return RunStatus(state, counters.get("env_steps", 0), counters.get("train_iterations", 0),
                         counters.get("policy_version", 0), latest.get("return_mean"),
                         sum(1 for w in s.get("workers", []) if w.get("role") == "collector"
                             and w.get("state") == "alive"), s)

    def _single_status(self) -> RunStatus:
        """A single run has no coordinator: its last evaluation, from its metrics file."""
        records = self._records()
        if not records:
            return RunStatus("starting")
        last = records[-1]
        return RunStatus("running", last["step"], int(last.get("eval/train_iterations", 0)),
                         0, last.get("eval/deterministic/return_mean"), 0, last)

    def _ended(self) -> RunStatus:
        s = self.summary or {}
        code = self._proc.returncode
        state = ("solved" if s.get("solved") else "crashed" if code in (1, 2) or not s
                 else "stopped")
        return RunStatus(state, s.get("env_steps", 0), s.get("train_iterations", 0),
                         s.get("policy_version", 0) or 0, s.get("eval_return"),
                         0, s)

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until the run ends, at most `timeout` seconds; its summary, or None if it
        still runs. A run that could not start raises `ConfigError` with the command's
        message."""
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._result()

    def stop(self, timeout: float = 60.0) -> dict[str, Any] | None:
        """Stop the run in order (as Ctrl-C stops `rlfleet up`: workers leave, the coordinator
        keeps its snapshot, the summary is written) and wait for it; its summary. After
        `timeout` seconds the command is killed (its children follow it)."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._lifeline()
        return self._result()

    def _result(self) -> dict[str, Any] | None:
        if self._proc.returncode == 2 and self.summary is None:
            raise ConfigError(self.log_tail().strip() or f"rlfleet {self.kind} exited with 2")
        return self.summary

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the command's own output (`launcher.log`)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _records(self) -> list[dict[str, Any]]:
        from rlfleet.shared.telemetry.rundata import JSONL_NAME, read_records

        path = self.run_dir / JSONL_NAME
        return list(read_records(path)) if path.is_file() else []

    @property
    def metrics(self) -> Any:
        """The run's `metrics.jsonl`, one row per record (its `scope`, `step`, `wall_time`
        and the metrics it logged): a pandas DataFrame where pandas is installed (the `tables`
        extra), else the list of records. Readable while the run goes."""
        records = self._records()
        try:
            import pandas as pd
        except ImportError:
            return records
        return pd.DataFrame(records)


def _overrides(overrides: Overrides) -> tuple[str, ...]:
    """Overrides as the command line's `key=value` items."""
    from rlfleet.shared.run.overrides import format_override

    if overrides is None:
        return ()
    if isinstance(overrides, Mapping):
        return tuple(format_override(k, v) for k, v in overrides.items())
    if isinstance(overrides, str):
        raise ConfigError("overrides: give a dict or a list of 'key=value' strings, not one "
                          "string")
    return tuple(str(item) for item in overrides)


def _resolve(config: Config, items: tuple[str, ...], run_dir: str | Path | None,
             runs_root: str | Path) -> tuple[str, Path]:
    """Check the config with its overrides (`ConfigError` naming the field) and choose the
    run directory, not made yet; the config as the child reads it (a dict: the file
    `_start` writes into the run directory)."""
    from rlfleet.shared.run.config import load_config, parse_config

    if isinstance(config, Mapping):
        cfg = parse_config(dict(config), "config", items)
    else:
        cfg = load_config(config, items)
    path = Path(run_dir) if run_dir is not None else _fresh_dir(Path(runs_root), cfg.name)
    path = path.resolve()
    return str(path / SOURCE_CONFIG if isinstance(config, Mapping) else config), path


def _fresh_dir(root: Path, name: str) -> Path:
    """runs/<name>-<time>, unique even for runs started in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = root / f"{name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _start(kind: str, options: CommandOptions, config: Config, path: Path,
           url: str | None) -> Run:
    """Make the run directory (with a config given as a dict, as `source-config.yaml`) and
    start the run's child: everything was checked before."""
    from rlfleet.shared.run.config import dump_config

    path.mkdir(parents=True, exist_ok=True)
    if isinstance(config, Mapping):
        (path / SOURCE_CONFIG).write_text(dump_config(dict(config)))
    return Run(kind, options, path, url)


def up(config: Config, *, collectors: int = 2, learners: int | None = None,
       overrides: Overrides = None, seed: int | None = None, storage: str | None = None,
       run_dir: str | Path | None = None, runs_root: str | Path = "runs",
       port: int | None = None, max_wall_s: float | None = None,
       max_env_steps: int | None = None, max_restarts: int = 10) -> Run:
    """Start a local cluster (`rlfleet up`) and return at once. `config`: a YAML path, the
    name of a packaged config (`"cartpole-dqn"`), or the config as a dict; `overrides`: a
    dict (`{"algo.lr": 3e-4}`) or `key=value` strings, as on the command line. Raises
    `ConfigError` naming the field for a config or an option that cannot run."""
    from rlfleet.local.options import LaunchOptions
    from rlfleet.ports import free_port

    items = _overrides(overrides)
    source, path = _resolve(config, items, run_dir, runs_root)
    port = port or free_port()
    options = LaunchOptions.checked(
        config=source, overrides=items, run_dir=str(path), port=port, collectors=collectors,
        learners=learners, seed=seed, storage=storage, max_wall_s=max_wall_s,
        max_env_steps=max_env_steps, max_restarts=max_restarts)
    return _start("up", options, config, path, f"http://127.0.0.1:{port}")


def single(config: Config, *, overrides: Overrides = None, seed: int | None = None,
           run_dir: str | Path | None = None, runs_root: str | Path = "runs") -> Run:
    """Train in one process (`rlfleet single`: no HTTP, no storage) and return at once; the
    same `Run` as `up` gives, with its evaluations in the run directory's `metrics.jsonl`."""
    from rlfleet.commands.single import SingleOptions

    items = _overrides(overrides)
    source, path = _resolve(config, items, run_dir, runs_root)
    options = SingleOptions.checked(config=source, overrides=items, seed=seed,
                                    run_dir=str(path))
    return _start("single", options, config, path, None)
