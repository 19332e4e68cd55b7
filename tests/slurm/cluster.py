"""A real Slurm cluster on this one machine: `slurmctld` on a host of its own and three
compute nodes, each running `slurmd`, every host a Linux network namespace with its own
address (`netns/hosts.py` builds them):

    switch namespace:  bridge br0 ── veth ── eth0 of each host namespace (10.214.0.x/24)
        ctl  10.214.0.2    slurmctld (port 6817), and munged
        n1   10.214.0.11   slurmd (port 6818)
        n2   10.214.0.12   slurmd
        n3   10.214.0.13   slurmd

Why namespaces: Slurm reaches each node at its own address, so a node can die as a machine
does (its slurmd and every job process on it killed at once, its address gone silent) while
the rest of the cluster goes on; and a job that calls Slurm itself (`sbatch` from inside a
job) has to do it over the network, from its node, as on a real cluster. Each daemon also
runs in a UTS namespace of its own whose hostname is its Slurm name (`ctl`, `n1`...): that
is how slurmctld knows it is `SlurmctldHost`, and what `hostname` says inside a job.

Everything lives in one work directory (a test's tmp path): `slurm.conf`, the munge key, the
socket of the cluster's own `munged` (a unix socket is reached from every namespace), the
controller's StateSaveLocation, each node's SlurmdSpoolDir, pid files and logs. A unix
socket's path has room for 107 bytes, which a tmp path can take most of, so sockets are
named through `/tmp/<run tag>`, a link to the work directory and the only thing the cluster
puts outside it. Nothing is written to /etc, and the machine's own Slurm or munge, if it
runs one, is never used: every daemon and client is pointed at this cluster's config by
`SLURM_CONF`, and Slurm at this munged by `AuthInfo=socket=...`.

The test's own namespace has no route to the cluster: `run` runs Slurm's commands on the
controller's host, and a process of the test's that must call Slurm itself runs on one of
the cluster's hosts (`spawn`, with `env()`).

The config is the smallest that behaves like a production cluster, made fast:
- each node declares 4 CPUs (`SlurmdParameters=config_overrides`: the machine may have
  fewer), so several 1-CPU jobs share a node (`select/cons_tres`, `CR_CPU`);
- a node whose slurmd stops answering is DOWN 6 to 12 s later, depending on where in its
  ping cycle it died (`SlurmdTimeout=3`: a ping a second; `MessageTimeout=3`), and returns
  to service as soon as its slurmd registers again (`ReturnToService=2`);
- batch jobs are requeueable unless submitted with `--no-requeue` (`JobRequeue=1`): when
  their node goes DOWN they are requeued, keeping their job id, and may start again 5 s
  later (`cred_expire=5`, the least Slurm accepts; the default is 120 s), with
  `SLURM_RESTART_COUNT` counting the reruns; a `--no-requeue` job ends NODE_FAIL;
- pending jobs are looked at every second (`sched_interval=1`, `bf_interval=1`);
- `KillWait=10`: a cancelled or requeued job gets SIGCONT and SIGTERM, and SIGKILL 10 s
  later. Until it is gone it is COMPLETING, and Slurm starts no other job on its node.

What no setting makes fast: slurmctld checks time limits every 30 s (`PERIODIC_TIMEOUT`,
fixed when Slurm is built). A job past its `--time` gets SIGTERM at the next check (up to
30 s late; the job ends TIMEOUT), and a `--signal=B:SIG@N` warning comes (with a SIGCONT)
at the first check that finds at most N + 30 s left: up to 30 s early, or late if that is
the job's first check (`--time=1 --signal=B:USR1@50`: USR1 28 s in, not 10 s).

Slurm 22.05's slurmd loads a cgroup plugin even when no plugin uses cgroups, and finds no
cgroup file system in a network namespace (`ip netns exec` mounts a fresh /sys), so
`cgroup.conf` names the v1 plugin, which then is never used.

Every process carries the run's marker in its environment (`Net.spawn`, and `run` for the
clients, whose environment jobs inherit), so `leftovers` finds any daemon, slurmstepd or job
process that outlived `close`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from integration.helpers import REPO, WaitTimeout, describe, marked_env, wait_for
from netns.hosts import PREFIX, Host, Net, NetError, Proc, _kill_inside, sh
from netns.hosts import unavailable as hosts_unavailable

SUBNET = "10.214.0"  # the netns suite uses 10.213.0
CTL_OCTET = 2
NODE_OCTET = 11  # n1 is .11, n2 .12, ...
CPUS_PER_NODE = 4
MEMORY_MB = 2000
SLURMD_TIMEOUT_S = 3
MESSAGE_TIMEOUT_S = 3
KILL_WAIT_S = 10
ENSURE = REPO / ".ci" / "ensure-slurm"
DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")

T = TypeVar("T")

# `scontrol -o show job` prints `Key=Value` pairs separated by spaces; a value may hold
# spaces (a Reason, a Command), so a pair runs up to the next ` Key=`.
_PAIR = re.compile(r"([\w/:.]+)=(.*?)(?=\s+[\w/:.]+=|\s*$)")


def _which(tool: str) -> str | None:
    return shutil.which(tool) or next(
        (p for p in (f"/usr/sbin/{tool}", f"/sbin/{tool}") if os.access(p, os.X_OK)), None)


def unavailable(install: bool = False) -> str | None:
    """Why a Slurm cluster cannot be built here, or None: hosts apart must be buildable
    (`netns.hosts.unavailable`: root, iproute2, nftables, Redis, namespaces with veths and a
    bridge), and Slurm's and munge's programs present (with `install`, first installed with
    `.ci/ensure-slurm`, apt-get), and a UTS namespace usable inside a network namespace."""
    why = hosts_unavailable()
    if why:
        return why
    if _which("unshare") is None:
        return "`unshare` is not installed (apt-get install util-linux)"
    missing = [t for t in (*DAEMONS, *CLIENTS) if _which(t) is None]
    if missing and install:
        subprocess.run(["bash", str(ENSURE)], capture_output=True, timeout=600, check=False)
        missing = [t for t in (*DAEMONS, *CLIENTS) if _which(t) is None]
    if missing:
        return f"no {', '.join(missing)} (run .ci/ensure-slurm: apt-get install slurm-wlm munge)"
    probe = f"{PREFIX}{os.getpid()}xslurmprobe"  # Net's tag format, so no sweep takes it
    try:
        sh("ip", "netns", "add", probe)
        sh("ip", "netns", "exec", probe, "unshare", "--uts", "hostname", "probe")
    except NetError as err:
        return f"no UTS namespace inside a network namespace: {err}"
    finally:
        sh("ip", "netns", "del", probe, check=False)
    return None


def _sweep_links() -> None:
    """The `/tmp/<run tag>` links of runs whose test process died before `close`."""
    for link in Path("/tmp").glob(f"{PREFIX}*x*"):
        owner = link.name[len(PREFIX):].split("x", 1)[0]
        if link.is_symlink() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            link.unlink(missing_ok=True)


def version() -> str:
    """The installed Slurm's version, e.g. "22.05.8"."""
    return sh(_which("slurmctld") or "slurmctld", "-V").split()[-1]


def parse_pairs(line: str) -> dict[str, str]:
    return {k: v.strip() for k, v in _PAIR.findall(line)}


class SlurmError(RuntimeError):
    pass


@dataclass(frozen=True)
class _Fatal:
    """What ends a wait at once, carried out of `wait_for` (which retries on errors)."""

    err: SlurmError


class DaemonDied(SlurmError):
    pass


class JobGone(SlurmError):
    pass


class SlurmCluster:
    """slurmctld, `nodes` slurmd and a munged, each on a host of its own. Use as a context
    manager, or `start()` then `close()`."""

    def __init__(self, workdir: Path, nodes: int = 3, cpus: int = CPUS_PER_NODE,
                 subnet: str = SUBNET, name: str = "rlfleet",
                 conf: dict[str, str | int] | None = None,
                 partitions: dict[str, str] | None = None) -> None:
        """`conf`: slurm.conf keys to set or override (e.g. {"KillWait": 30}).
        `partitions`: name -> the rest of its `PartitionName=` line (e.g. {"learn": "Nodes=n1
        Default=YES", "collect": "Nodes=n2,n3 LLN=YES"}), in place of one `main` partition
        over every node."""
        self.partitions = partitions or {
            "main": "Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"}
        self.workdir = Path(workdir)
        self.names = [f"n{i}" for i in range(1, nodes + 1)]
        self.cpus = cpus
        self.cluster_name = name
        self.extra_conf = conf or {}
        self.net = Net(self.workdir, subnet=subnet)
        self.conf = self.workdir / "slurm.conf"
        # munged's socket, and slurmstepd's in each node's spool, through a short link
        self.short = Path(f"/tmp/{self.net.tag}")
        self.munge_socket = self.short / "munge" / "munge.sock"
        self.daemons: dict[str, Proc] = {}  # "slurmctld", "munged", and each node's name
        self.down: set[str] = set()  # nodes killed by `kill_node`, not yet revived
        self.started_s: float | None = None  # how long `start` took
        self.closed_hard: list[str] | None = None  # what `close` had to kill, once closed

    # -- hosts ---------------------------------------------------------------------------------

    @property
    def ctl(self) -> Host:
        return self.net.hosts["ctl"]

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    # -- starting --------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.net.start()  # sweeps the namespaces of runs that died; their links go here
        _sweep_links()
        self.short.symlink_to(self.workdir.resolve(), target_is_directory=True)
        self.net.add_host("ctl", CTL_OCTET)
        for i, name in enumerate(self.names):
            self.net.add_host(name, NODE_OCTET + i)
        self._write_files()
        self._start_munged()
        self.daemons["slurmctld"] = self._spawn(self.ctl, "slurmctld", [
            _which("slurmctld") or "slurmctld", "-D", "-i", "-f", str(self.conf)])
        for name in self.names:
            self._start_slurmd(name)
        self.wait_nodes(self.names, ("IDLE",), timeout)
        self.started_s = time.monotonic() - t0
        return self

    def __enter__(self) -> SlurmCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_files(self) -> None:
        w = self.workdir
        for sub in ("munge", "state", "log", "run", *(f"spool/{n}" for n in self.names)):
            (w / sub).mkdir(parents=True, exist_ok=True)
        # munged wants its directories private and its key root's and unreadable by others
        os.chmod(w / "munge", 0o700)
        key = w / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for spool in (w / "spool").iterdir():
            os.chmod(spool, 0o755)  # job scripts run from here
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={self.host(name).ip} CPUs={self.cpus} "
            f"RealMemory={MEMORY_MB} State=UNKNOWN" for name in self.names)
        partitions = "\n".join(f"PartitionName={name} {rest}"
                               for name, rest in self.partitions.items())
        self.conf.write_text(f"""\
# Written by tests/slurm/cluster.py: a test cluster of its own; see the module docstring.
ClusterName={self.cluster_name}
SlurmctldHost=ctl({self.ctl.ip})
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=5
StateSaveLocation={w}/state
SlurmdSpoolDir={self.short}/spool/%n
SlurmctldPidFile={w}/run/slurmctld.pid
SlurmdPidFile={w}/run/slurmd-%n.pid
SlurmctldLogFile={w}/log/slurmctld.log
SlurmdLogFile={w}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={w}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1,batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
JobRequeue=1
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
SlurmctldTimeout=10
MessageTimeout={MESSAGE_TIMEOUT_S}
TCPTimeout=2
BatchStartTimeout=10
KillWait={KILL_WAIT_S}
UnkillableStepTimeout=30
MinJobAge=10
InactiveLimit=0
Waittime=0
{nodes}
{partitions}
""")
        if self.extra_conf:  # the caller's keys replace the defaults
            lines = [ln for ln in self.conf.read_text().splitlines()
                     if ln.split("=", 1)[0] not in self.extra_conf]
            lines += [f"{k}={v}" for k, v in self.extra_conf.items()]
            self.conf.write_text("\n".join(lines) + "\n")
        (w / "plugstack.conf").write_text("")  # not /etc/slurm's
        # Named, so slurmd does not look for a cgroup file system (see the docstring).
        (w / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")

    def _spawn(self, host: Host, name: str, argv: list[str]) -> Proc:
        """`argv` on `host`, in a UTS namespace whose hostname is the host's name."""
        return self.net.spawn(host, name, [
            "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host.name, *argv],
            {"SLURM_CONF": str(self.conf)})

    def _start_munged(self) -> None:
        m = self.workdir / "munge"
        self.daemons["munged"] = self._spawn(self.ctl, "munged", [
            _which("munged") or "munged", "--foreground", "--force",
            f"--socket={self.munge_socket}", f"--key-file={m / 'munge.key'}",
            f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
            f"--seed-file={m / 'munged.seed'}", "--num-threads=4"])
        wait_for(lambda: self._alive("munged") and self.munge_socket.exists(), 20,
                 "munged to open its socket", interval=0.05)

    def _start_slurmd(self, name: str) -> None:
        self.daemons[name] = self._spawn(self.host(name), f"slurmd-{name}", [
            _which("slurmd") or "slurmd", "-D", "-N", name, "-f", str(self.conf)])

    def _alive(self, daemon: str) -> bool:
        proc = self.daemons[daemon]
        if not proc.alive():
            raise DaemonDied(f"{daemon} exited {proc.popen.returncode}:\n{proc.tail()}\n"
                             f"{self.log_tail(daemon)}")
        return True

    def log_tail(self, daemon: str, lines: int = 30) -> str:
        """The end of a daemon's own log ("slurmctld", "munged" or a node's name)."""
        path = {"munged": self.workdir / "munge" / "munged.log",
                "slurmctld": self.workdir / "log" / "slurmctld.log"}.get(
            daemon, self.workdir / "log" / f"slurmd-{daemon}.log")
        with contextlib.suppress(OSError):
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    # -- clients ---------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to run Slurm's commands against this
        cluster (from any of its hosts; a job inherits it from `sbatch`)."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, host: str = "ctl", check: bool = True,
            timeout: float = 30.0) -> subprocess.CompletedProcess:
        """A Slurm command (`sbatch`, `squeue`, `scontrol`...) run on `host` (the
        controller's by default: the test's own namespace has no route to the cluster), in
        the work directory, with this run's marker, which the jobs it submits inherit."""
        res = subprocess.run(self.host(host).cmd(*argv), capture_output=True, text=True,
                             timeout=timeout, cwd=self.workdir,
                             env={**marked_env(self.net.marker), **self.env()})
        if check and res.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` exited {res.returncode}: "
                             f"{res.stderr.strip()}")
        return res

    def spawn(self, host: str, name: str, argv: list[str],
              env: dict[str, str] | None = None) -> Proc:
        """A process of the test's own (a service that submits jobs, say) on one of the
        cluster's hosts, able to run Slurm's commands; stopped by `close`. More hosts can
        be added with `self.net.add_host(name, octet)` (free: 3-10, and past the nodes)."""
        return self.net.spawn(self.host(host), name, argv, {**self.env(), **(env or {})})

    def sbatch(self, script: Path | str, *args: str, script_args: Sequence[str] = (),
               host: str = "ctl") -> int:
        """Submit `script` with `args` (sbatch's options: "-w", "n1", "--requeue"...) and
        `script_args` (the script's own); returns the job id."""
        out = self.run("sbatch", "--parsable", *args, str(script), *script_args,
                       host=host).stdout
        return int(out.strip().split(";")[0])

    def jobs(self) -> list[dict]:
        """Every job slurmctld still holds (finished ones until `MinJobAge`, 10 s, passes),
        each as {"id", "name", "state", "nodes", "reason", "restarts", "raw"}: "raw" is
        the whole `scontrol show job` record (see `job`)."""
        out = self.run("scontrol", "-o", "show", "jobs").stdout
        jobs = []
        for line in out.splitlines():
            if not line.startswith("JobId="):  # "No jobs in the system"
                continue
            raw = parse_pairs(line)
            jobs.append({"id": int(raw["JobId"]), "name": raw.get("JobName", ""),
                         "state": raw.get("JobState", ""), "nodes": raw.get("NodeList", ""),
                         "reason": raw.get("Reason", ""),
                         "restarts": int(raw.get("Restarts", "0")), "raw": raw})
        return jobs

    def job(self, job_id: int) -> dict[str, str] | None:
        """`scontrol show job` as a dict (JobState, NodeList, Reason, Restarts, ExitCode,
        BatchHost...), or None once slurmctld no longer holds the job."""
        res = self.run("scontrol", "-o", "show", "job", str(job_id), check=False)
        if res.returncode != 0:
            if "Invalid job id" in res.stderr:
                return None
            raise SlurmError(f"scontrol show job {job_id}: {res.stderr.strip()}")
        return parse_pairs(res.stdout.strip())

    def job_state(self, job_id: int) -> str | None:
        job = self.job(job_id)
        return job["JobState"] if job else None

    def wait_state(self, job_id: int, states: Iterable[str] | str,
                   timeout: float = 30.0) -> str:
        """Wait until the job is in one of `states` (e.g. "RUNNING", "COMPLETED",
        "PENDING"); returns that state."""
        wanted = {states} if isinstance(states, str) else set(states)

        def reached() -> str | None:
            state = self.job_state(job_id)
            if state is None:
                raise JobGone(f"job {job_id} is gone (finished more than MinJobAge ago?)")
            return state if state in wanted else None

        return self._wait(reached, timeout, f"job {job_id} to be {'/'.join(sorted(wanted))}")

    def _wait(self, predicate: Callable[[], T], timeout: float, what: str,
              interval: float = 0.1) -> T:
        """`wait_for(predicate, ...)`, except that a daemon that died (other than a node
        killed on purpose), or a job gone, ends the wait at once."""
        def checked() -> T | _Fatal:
            try:
                for daemon in self.daemons:
                    if daemon not in self.down:
                        self._alive(daemon)
                return predicate()
            except (JobGone, DaemonDied) as err:
                return _Fatal(err)

        value = wait_for(checked, timeout, what, interval=interval)
        if isinstance(value, _Fatal):
            raise value.err
        return value

    def node(self, name: str) -> dict[str, str]:
        return parse_pairs(self.run("scontrol", "-o", "show", "node", name).stdout.strip())

    def node_state(self, name: str) -> str:
        """The node's state as `scontrol` writes it: "IDLE", "MIXED", "ALLOCATED",
        "DOWN+NOT_RESPONDING", "IDLE+NOT_RESPONDING"..."""
        return self.node(name)["State"]

    def wait_nodes(self, names: Iterable[str], states: Iterable[str],
                   timeout: float = 30.0) -> dict[str, str]:
        """Wait until each node's state has one of `states` among its parts ("DOWN" matches
        "DOWN+NOT_RESPONDING"); returns their states."""
        wanted, names = set(states), list(names)

        def reached() -> dict[str, str] | None:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
            got = {n: s.upper() for n, s in (line.split() for line in out.splitlines())}
            ok = all(n in got and wanted & set(re.split(r"[+*~#!%$@^-]", got[n]))
                     for n in names)
            return {n: self.node_state(n) for n in names} if ok else None

        return self._wait(reached, timeout, f"nodes {names} to be {'/'.join(sorted(wanted))}",
                          interval=0.2)

    # -- faults ----------------------------------------------------------------------------------

    def kill_node(self, name: str, unplug: bool = True) -> list[int]:
        """The node dies as a machine does: its slurmd and every process on it (slurmstepd,
        the jobs) are SIGKILLed at once, and (`unplug`) its link goes down, so its address
        answers nothing (no refusal, as from a dead machine). Returns the pids killed."""
        proc = self.daemons[name]
        self.down.add(name)
        if unplug:
            sh(*self.host(name).cmd("ip", "link", "set", "eth0", "down"))
        proc.kill_group()
        pids = [proc.popen.pid, *_kill_inside(self.host(name).ns)]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(10)
        if proc.popen.returncode is not None:  # reaped: its pid may be reused, so `close`
            self.net.procs.remove(proc)  # must not signal it
        return sorted(set(pids))

    def revive_node(self, name: str, timeout: float = 30.0) -> str:
        """Start the node's slurmd again and wait until the node takes jobs; returns its
        state. `ReturnToService=2` brings a DOWN node back when it registers; a node set
        DOWN another way (by hand) is resumed."""
        if self.daemons[name].alive():
            raise SlurmError(f"{name}'s slurmd is running")
        sh(*self.host(name).cmd("ip", "link", "set", "eth0", "up"))
        self._start_slurmd(name)
        self.down.discard(name)

        def up() -> bool:
            state = self.node_state(name)
            if "DOWN" in state and "NOT_RESPONDING" not in state:
                self.run("scontrol", "update", f"nodename={name}", "state=resume",
                         check=False)
            return bool(re.match(r"(IDLE|MIXED|ALLOCATED)(?!.*NOT_RESPONDING)", state))

        self._wait(up, timeout, f"{name} to take jobs again", interval=0.2)
        return self.node_state(name)

    # -- teardown --------------------------------------------------------------------------------

    def close(self, grace_s: float = 15.0) -> list[str]:
        """Cancel every job and wait (up to KillWait and a little) for them to end, then stop
        the daemons and delete the namespaces. Returns what had to be killed hard: daemons
        that ignored SIGTERM for `grace_s`, and processes found left in a namespace."""
        stubborn: list[str] = []
        ctl_up = "slurmctld" in self.daemons and self.daemons["slurmctld"].alive()
        if ctl_up:
            with contextlib.suppress(SlurmError, subprocess.TimeoutExpired):
                ids = [str(j["id"]) for j in self.jobs()
                       if j["state"] not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
                                             "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                                             "DEADLINE", "OUT_OF_MEMORY")]
                if ids:
                    self.run("scancel", *ids, check=False)
                with contextlib.suppress(WaitTimeout):
                    wait_for(lambda: not self._job_processes(), self.kill_wait_s + 5,
                             "cancelled jobs to end", interval=0.2)
            stubborn += [f"job process {d}" for d in self._job_processes()]
        stubborn += self.net.close(grace_s)
        if self.short.is_symlink():
            self.short.unlink()
        self.closed_hard = stubborn
        return stubborn

    @property
    def kill_wait_s(self) -> int:
        return int(self.extra_conf.get("KillWait", KILL_WAIT_S))

    def _job_processes(self) -> list[str]:
        """slurmstepd and job processes still alive on the nodes."""
        left = []
        for name in self.names:
            if name not in self.net.hosts or name not in self.daemons:
                continue
            ns = self.host(name).ns
            pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).split()]
            slurmd = self.daemons[name].popen.pid
            left += [describe([p]) for p in pids if p != slurmd]
        return left

    def leftovers(self) -> list[str]:
        """What outlived `close` (nothing, when it went well): this run's namespaces, and
        processes carrying its marker or naming its work directory (daemons, slurmstepd,
        jobs)."""
        left = [f"namespace {ns}" for ns in self.net.remaining()]
        if self.short.is_symlink():
            left.append(f"link {self.short}")
        pids = set(self.net.leftovers())
        needle = f"{self.workdir}/".encode()  # daemons name files in it: slurm.conf...
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if needle in (entry / "cmdline").read_bytes():
                        pids.add(int(entry.name))
        pids.discard(os.getpid())
        alive = [p for p in sorted(pids) if _running(p)]
        return left + [f"process {describe([p])}" for p in alive]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def running_cluster(workdir: Path, **kwargs: object) -> Iterator[SlurmCluster]:
    """A started cluster for the block, closed after it, which then asserts that `close`
    had to kill nothing hard and nothing was left behind. A pytest fixture's body:

        with running_cluster(tmp_path / "slurm") as cluster:
            yield cluster
    """
    cluster = SlurmCluster(workdir, **kwargs)  # type: ignore[arg-type]
    with cluster:
        yield cluster
    left = cluster.leftovers()
    assert not cluster.closed_hard, f"killed hard at close: {cluster.closed_hard}"
    assert not left, f"left behind: {left}"
