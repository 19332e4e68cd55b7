"""Memory of a local cluster while it trains: every process's PSS and RSS, per process and per
role, beside one bare `import torch` process measured in the same run.

`rlfleet up` runs the config (CartPole DQN, 2 collectors by default) as a subprocess; every
`--interval-s` this script walks the launcher's process tree with psutil and reads each
process's PSS, RSS and USS (`/proc/PID/smaps_rollup`) until the run stops (solved, or its
`--max-wall-s`). PSS is the figure that adds up: a page shared by N processes counts 1/N in
each, so the sum over the tree is what the cluster really takes from the machine; RSS counts
shared pages (libpython, torch's libraries) once per process and overstates the sum.

    python -m bench.footprint [--config configs/cartpole-dqn.yaml] [--collectors 2]
                              [--max-wall-s 90] [--interval-s 0.25] [--storage DIR_OR_REDIS]
                              [--short]

The reference row is a bare `python -c "import torch, gymnasium"` process: whatever a role
costs beyond it is the role's own (its buffers, its threads' arenas, its env and policy).
Progress goes to stderr; stdout carries the tables and, as its last line, one JSON object:
`peak_pss_mb` and `peak_rss_mb` (the largest sum over the tree at one sample), `processes`
(the number in the tree at the PSS peak), `per_role_pss_mb` (each role's largest sum at one
sample, collectors together), `per_process` (each process's own peaks), `first_chunk_s` (from
the launch of `rlfleet up`, as its summary.json says) and the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from rich.table import Table

from bench.common import (
    REPO_ROOT,
    clear_storage,
    fmt,
    is_redis,
    log,
    parse_args,
    report,
    run_main,
    start_up,
)
from rlfleet.local.forking import role_in

GOAL_PSS_MB = 800.0
MB = 1024 * 1024
ROLES = ("up", "coordinator", "learner", "collector")
# `per_role_pss_mb` holds one figure per role.
FIGURES = ("peak_pss_mb", "peak_rss_mb", "processes", "per_role_pss_mb", "first_chunk_s")
# Every role started and training for a few seconds: the peaks of a young cluster.
SHORT = {"max_wall_s": 8.0}


@dataclass
class Proc:
    """One process of the tree, named by its role, its worker id and (for a forked server
    worker) the process it was forked from."""

    pid: int
    role: str
    name: str
    peak_pss: float = 0.0
    peak_rss: float = 0.0
    peak_uss: float = 0.0
    threads: int = 0
    torch: bool = False
    samples: int = 0


@dataclass
class Sample:
    t: float
    pss: float
    rss: float
    by_role: dict[str, float] = field(default_factory=dict)
    processes: int = 0


def describe(proc: psutil.Process, parent_cmd: list[str] | None) -> tuple[str, str]:
    """(role, name) from the command line: `python -m rlfleet <role> ... --worker-id N`
    for an exec'd child, `rlfleet <role> ...` for a child `rlfleet up` forked (its title). A
    process with its parent's command line is a fork that has not taken its title yet."""
    try:
        cmd = " ".join(proc.cmdline()).split()  # a title is one string, padded with NULs
    except psutil.Error:
        return "other", str(proc.pid)
    role = role_in(cmd) or "other"
    if role not in ROLES:
        return "other", f"{Path(cmd[0]).name if cmd else '?'} {proc.pid}"
    name = role
    if "--worker-id" in cmd[:-1]:
        name = cmd[cmd.index("--worker-id") + 1]
    if role == "up":
        name = "rlfleet up"
    if parent_cmd is not None and " ".join(parent_cmd).split() == cmd:
        name += " (forked, starting)"
    return role, name


def _module(proc: psutil.Process) -> str:
    """What a helper process runs: `python -m <module>`'s module, else its program."""
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return str(proc.pid)
    if "-m" in cmd and cmd.index("-m") + 1 < len(cmd):
        return cmd[cmd.index("-m") + 1]
    return Path(cmd[0]).name if cmd else str(proc.pid)


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children()
    except psutil.Error:
        return []


def has_torch(pid: int) -> bool:
    """Whether torch's shared library is mapped into the process (it was imported)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch_cpu" in f.read()
    except OSError:
        return False


class Sampler:
    def __init__(self, root: int) -> None:
        self.root = psutil.Process(root)
        self.procs: dict[int, Proc] = {}
        self.samples: list[Sample] = []
        self.t0 = time.monotonic()

    def tree(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> None:
        s = Sample(time.monotonic() - self.t0, 0.0, 0.0)
        for p in self.tree():
            try:
                mem = p.memory_full_info()
                threads = p.num_threads()
            except psutil.Error:  # exited between the walk and the read
                continue
            known = self.procs.get(p.pid)
            if known is None:
                try:
                    parent = p.parent()
                    parent_cmd = parent.cmdline() if parent else None
                except psutil.Error:
                    parent = parent_cmd = None
                role, name = describe(p, parent_cmd)
                owner = self.procs.get(parent.pid) if parent is not None else None
                if role == "other" and owner is not None:  # a role's helper process (the
                    role = owner.role                      # learner's data process) is its
                    name = f"{owner.name}: {_module(p)}"   # role's memory
                known = self.procs[p.pid] = Proc(p.pid, role, name)
            if known.samples % 8 == 0:  # torch may be imported late (lazily)
                known.torch = known.torch or has_torch(p.pid)
            known.samples += 1
            known.peak_pss = max(known.peak_pss, mem.pss / MB)
            known.peak_rss = max(known.peak_rss, mem.rss / MB)
            known.peak_uss = max(known.peak_uss, mem.uss / MB)
            known.threads = max(known.threads, threads)
            s.pss += mem.pss / MB
            s.rss += mem.rss / MB
            s.by_role[known.role] = s.by_role.get(known.role, 0.0) + mem.pss / MB
            s.processes += 1
        if s.processes:
            self.samples.append(s)


def reference_torch() -> dict[str, float]:
    """PSS/RSS/USS of a bare interpreter that has imported torch and gymnasium and made one
    small tensor op: the floor of any process that acts or learns with torch."""
    code = ("import sys, torch, gymnasium; torch.set_num_threads(1); "
            "torch.zeros(4, 4) @ torch.zeros(4, 4); print('ready', flush=True); "
            "sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        mem = psutil.Process(proc.pid).memory_full_info()
        return {"pss_mb": mem.pss / MB, "rss_mb": mem.rss / MB, "uss_mb": mem.uss / MB}
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def run(config: Path, collectors: int, max_wall_s: float, interval_s: float,
        storage: str | None, run_dir: Path) -> tuple[Sampler, dict, int]:
    options = ["--max-wall-s", str(max_wall_s)]
    if storage:
        options += ["--storage", storage]
        if is_redis(storage):
            clear_storage(storage, run_dir.name[:64])
    proc = start_up(config, run_dir, collectors, *options)
    sampler = Sampler(proc.pid)
    try:
        while proc.poll() is None:
            sampler.sample()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=60)
        raise
    if storage and is_redis(storage):
        clear_storage(storage, run_dir.name[:64])
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return sampler, summary, proc.returncode


def summarise(sampler: Sampler, summary: dict, reference: dict, code: int,
              collectors: int) -> dict:
    peak = max(sampler.samples, key=lambda s: s.pss, default=None)
    peak_rss = max((s.rss for s in sampler.samples), default=None)
    per_role = {role: round(max((s.by_role.get(role, 0.0) for s in sampler.samples),
                                default=0.0), 1)
                for role in ROLES}
    return {
        "peak_pss_mb": round(peak.pss, 1) if peak else None,
        "peak_rss_mb": round(peak_rss, 1) if peak_rss is not None else None,
        "processes": peak.processes if peak else 0,
        "per_role_pss_mb": per_role,
        "goal_peak_pss_mb": GOAL_PSS_MB,
        "per_process": [{"name": p.name, "role": p.role, "pss_mb": round(p.peak_pss, 1),
                         "rss_mb": round(p.peak_rss, 1), "uss_mb": round(p.peak_uss, 1),
                         "threads": p.threads, "torch": p.torch}
                        for p in sorted(sampler.procs.values(), key=_order)],
        "torch_process_reference": {k: round(v, 1) for k, v in reference.items()},
        "first_chunk_s": summary.get("first_chunk_s_from_launch"),
        "solved": summary.get("solved"),
        "outcome": summary.get("outcome", f"exit {code}"),
        "env_steps": summary.get("env_steps"),
        "wall_s": summary.get("wall_seconds"),
        "collectors": collectors,
        "samples": len(sampler.samples),
    }


def _order(p: Proc) -> tuple[int, str]:
    return (ROLES.index(p.role) if p.role in ROLES else len(ROLES), p.name)


def tables(result: dict) -> list[Table]:
    per = Table(title="memory per process (peaks over the run, MB)",
                caption="PSS: shared pages split among the processes that map them (these add "
                        "up); RSS counts them in each; USS: the process's own pages")
    for name in ("process", "role", "PSS", "RSS", "USS", "threads", "torch"):
        per.add_column(name, justify="left" if name in ("process", "role") else "right")
    for p in result["per_process"]:
        per.add_row(p["name"], p["role"], fmt(p["pss_mb"]), fmt(p["rss_mb"]),
                    fmt(p["uss_mb"]), str(p["threads"]), "yes" if p["torch"] else "no")
    ref = result["torch_process_reference"]
    per.add_section()
    per.add_row("python + import torch, gymnasium", "reference", fmt(ref["pss_mb"]),
                fmt(ref["rss_mb"]), fmt(ref["uss_mb"]), "-", "yes", style="dim")

    roles = Table(title=f"memory of the cluster ({result['collectors']} collectors), PSS")
    for name in ("what", "peak", "goal"):
        roles.add_column(name, justify="left" if name == "what" else "right")
    for role, mb in result["per_role_pss_mb"].items():
        roles.add_row(f"role: {role}" + (" (all)" if role == "collector" else ""),
                      fmt(mb, ".1f", " MB"), "")
    roles.add_section()
    roles.add_row(f"whole tree, {result['processes']} processes", fmt(result["peak_pss_mb"],
                  ".1f", " MB"), f"<= {GOAL_PSS_MB:.0f} MB", style="bold")
    roles.add_row("whole tree, RSS (shared pages counted per process)",
                  fmt(result["peak_rss_mb"], ".1f", " MB"), "")
    roles.add_row("first chunk after launch", fmt(result["first_chunk_s"], ".2f", " s"),
                  "<= 1.5 s")
    roles.add_row("run", f"{result['outcome']}, {fmt(result['env_steps'], ',')} env steps, "
                  f"{fmt(result['wall_s'], '.1f', ' s')}", "")
    return [per, roles]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "cartpole-dqn.yaml")
    p.add_argument("--collectors", type=int, default=2)
    p.add_argument("--max-wall-s", type=float, default=90.0,
                   help="the run stops here if it has not solved (default 90)")
    p.add_argument("--interval-s", type=float, default=0.25, help="between two samples")
    p.add_argument("--storage", default=None,
                   help="directory or redis://host:port/db (default: the run dir's own)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the run dir goes (default: a fresh temporary directory, kept)")
    args = parse_args(p, argv, SHORT)

    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="rlfleet-footprint-"))).resolve()
    run_dir = work / f"footprint-{time.strftime('%H%M%S')}-{os.getpid()}"
    log("reference: a bare process importing torch and gymnasium...")
    reference = reference_torch()
    log(f"rlfleet up {args.config.name} with {args.collectors} collectors, sampling every "
        f"{args.interval_s:g} s; run dir {run_dir}")
    sampler, summary, code = run(args.config.resolve(), args.collectors, args.max_wall_s,
                                 args.interval_s, args.storage, run_dir)
    if not sampler.samples:
        log(f"[red]no sample taken: rlfleet up exited with {code}; see {run_dir / 'up.log'}[/]")
        return 1
    result = summarise(sampler, summary, reference, code, args.collectors)
    log(f"{result['outcome']}: peak PSS {result['peak_pss_mb']:.0f} MB over "
        f"{result['processes']} processes ({len(sampler.samples)} samples)")
    report(result, *tables(result))
    return 0


if __name__ == "__main__":
    run_main(main)
