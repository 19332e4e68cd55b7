"""Whether a config can run, answered in the launcher without torch: the launcher watches the
run for its whole length, and its first children are forks of it (`services/local/forking.py`),
which torch's thread pools would not survive."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.run.config import RunConfig


def names_code(cfg: RunConfig) -> bool:
    """Whether a config names code by import path (`algo.policy`, `algo.reward_model`, an
    `env.id` such as `package.module:Env`, learner hooks or metric writers): only importing
    and building it can check it."""
    return (bool(cfg.algo.policy) or cfg.algo.reward_model is not None or ":" in cfg.env.id
            or bool(cfg.learner.hooks) or bool(cfg.logging.writers))


def check_config(cfg: RunConfig, path: Path | str, devices: bool = True) -> None:
    """`check_runnable` without torch or anyone's code in this process. A built-in algorithm
    on a gymnasium env is checked here without building the policy: the env's module,
    gymnasium and numpy are what the forked collectors need anyway. A config that names code
    by import path is built by a `rlfleet check` child (that code may import torch), whose
    one-line error becomes ours. `devices`: this machine's CUDA devices are the ones the run
    gets (not so for a submission to a cluster). Raises `ConfigError`."""
    if devices:
        check_devices(cfg)
    if not names_code(cfg):
        from rlfleet.shared.run.check import check_runnable

        check_runnable(cfg, build=False)
        return
    done = subprocess.run([sys.executable, "-m", "rlfleet", "check", "--config",
                           str(path)], capture_output=True, text=True, cwd=os.getcwd())
    text = done.stderr.strip()
    if done.returncode != 0:
        said = text.find("rlfleet check: ")
        if said >= 0:  # a ConfigError, said in full (after any warnings)
            raise ConfigError(text[said:].removeprefix("rlfleet check: "))
        last = text.splitlines()[-1] if text else f"exit code {done.returncode}"
        raise ConfigError(f"building what {path} names failed: {last}")
    # what the check warned of (an old import path, a name one typo from a hook)
    for line in [*text.splitlines(), *done.stdout.splitlines()]:
        if "Warning:" in line or line.startswith("warning: "):
            print(line.strip(), file=sys.stderr)


def check_devices(cfg: RunConfig) -> None:
    """A config that asks for CUDA on a machine without it, refused before anything starts:
    every local learner and collector would otherwise fail the same way, later. torch is
    imported only when a setting names CUDA."""
    wants = [(f, v) for f, v in (("learner.device", cfg.learner.device),
                                 ("collector.device", cfg.collector.device))
             if v.startswith("cuda")]
    if not wants:
        return
    from rlfleet.shared.algos.device import cuda_refusal

    # Counted in a child: CUDA initialised here would not survive the fork of the children
    # (`Cannot re-initialize CUDA in forked subprocess`).
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count()"
                           " if torch.cuda.is_available() else 0)"], capture_output=True,
                          text=True, timeout=300)
    count = int(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip().isdigit() \
        else 0
    for field, value in wants:
        why = cuda_refusal(value, field, count)
        if why:
            raise ConfigError(why)
