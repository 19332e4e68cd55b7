"""Hosts apart: every role of a cluster on a host of its own, built from Linux network
namespaces, so the network between roles can be slowed, made lossy and cut as Jepsen does
between machines.

    switch namespace:  bridge br0 ── veth ── eth0 of each host namespace (10.213.0.x/24)

Each host has its own loopback, its own address and its own firewall: nothing one role
sends another can take a shortcut through loopback, and a partition is a firewall rule in
the hosts it separates, as on real machines. The switch is a namespace of its own too, so
nothing here touches the machine's own interfaces.

Faults:
- `Net.shape`: `netem delay D loss L` on every host's veth (what the host sends is delayed
  and thinned; two hosts are 2 x D apart). Where the kernel has no netem (or with
  `RLFLEET_NETNS_SHAPING=relay`), the same delay and loss come from `relay.py`, a userspace
  switch that takes over the bridge's ports.
- `Net.cut`: a silent partition, as Jepsen makes one: each side's firewall drops what the
  other sends (nothing is refused or reset), so connections stall until their timeouts.

Every name carries a per-run tag (`rlfnet<pid>x<random>`), so two runs never clash; `close`
stops every process the run started and kills whatever is still inside its namespaces, then
deletes the namespaces (their veths, bridge and firewall tables go with them).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import requests
from chaos.harness import Monitor
from integration.helpers import REPO, marked_env, marked_pids, wait_for

PREFIX = "rlfnet"
RELAY = Path(__file__).with_name("relay.py")
RLFLEET = Path(sys.executable).with_name("rlfleet")
FAULT_TABLE = "rlfleet_fault"
CLONE_NEWNET = 0x40000000
API = "/api/v1"
REDIS_PORT = 6390
COORDINATOR_PORT = 8000
WORKER_PORT = 8100

# Stopped in this order at teardown: workers leave while the coordinator still answers, and
# the network (the relay) goes last.
STOP_ORDER = {"coordinator": 1, "redis": 2, "relay": 3}

_libc = ctypes.CDLL(None, use_errno=True)


class NetError(RuntimeError):
    pass


def sh(*cmd: str, stdin: str | None = None, check: bool = True) -> str:
    res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise NetError(f"`{' '.join(cmd)}` exited {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def unavailable() -> str | None:
    """Why hosts apart cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root: network namespaces, veths and nftables"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"),
                          ("redis-server", "redis-server")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install {package})"
    if not RLFLEET.exists():
        return f"no rlfleet entry point beside {sys.executable} (pip install -e .)"
    probe = f"{PREFIX}{os.getpid()}xprobe"  # the tag format, so no sweep takes it
    try:
        sh("ip", "netns", "add", probe)
    except NetError as err:
        return f"`ip netns` is not usable here: {err}"
    try:
        sh("ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        sh("ip", "-n", probe, "link", "add", "b0", "type", "bridge")
    except NetError as err:
        return f"no veth or bridge in a network namespace: {err}"
    finally:
        sh("ip", "netns", "del", probe, check=False)
    return None


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _kill_inside(ns: str) -> list[int]:
    pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def sweep_stale() -> list[str]:
    """Namespaces left by a run whose test process was killed (so its teardown never ran):
    what runs inside them is killed and they are deleted. A live run's are left alone."""
    swept = []
    for line in sh("ip", "netns", "list").splitlines():
        ns = line.split()[0] if line.strip() else ""
        if not ns.startswith(PREFIX):
            continue
        owner = ns[len(PREFIX):].split("x", 1)[0]
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            continue
        _kill_inside(ns)
        sh("ip", "netns", "del", ns, check=False)
        swept.append(ns)
    return swept


@dataclass
class Host:
    name: str
    ns: str
    ip: str
    port: str  # its veth's end in the switch namespace

    def cmd(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Sockets this thread opens in the block belong to the host's network namespace
        (`setns` moves only the calling thread), so the test reaches the cluster the way
        the host's own processes do, and only through the links the host has."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        there = os.open(f"/run/netns/{self.ns}", os.O_RDONLY)
        try:
            _setns(there)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(there)
            os.close(home)

    def handshake_s(self, ip: str, port: int, timeout: float = 5.0) -> float | None:
        """Seconds a TCP handshake from this host to ip:port takes (one round trip), or
        None when nothing answers within `timeout` (a partition, or a lost SYN and its
        retransmissions). A refusal is an answer: it raises ConnectionRefusedError."""
        with self.inside():
            sock = socket.socket()
        try:
            sock.settimeout(timeout)
            t0 = time.monotonic()
            sock.connect((ip, port))
            return time.monotonic() - t0
        except TimeoutError:
            return None
        finally:
            sock.close()


@dataclass
class Proc:
    name: str
    host: Host
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)


@dataclass
class Net:
    """The switch, the hosts on it, the processes started on them, and the faults."""

    workdir: Path
    subnet: str = "10.213.0"
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}")
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    shaping: str | None = None  # "netem" or "relay" once the links are shaped
    cut_in: set[str] = field(default_factory=set)  # namespaces holding a fault table

    @property
    def switch(self) -> str:
        return f"{self.tag}-switch"

    def _add_ns(self, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # No IPv6: its router and neighbour chatter is noise on a test network.
        sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w",
           "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")

    def start(self) -> Net:
        sweep_stale()
        self._add_ns(self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        return self

    def add_host(self, name: str, octet: int) -> Host:
        host = Host(name, f"{self.tag}-{name}", f"{self.subnet}.{octet}", f"p-{name}"[:15])
        self._add_ns(host.ns)
        sh("ip", "-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name",
           "eth0", "netns", host.ns)
        sh("ip", "-n", self.switch, "link", "set", host.port, "master", "br0", "up")
        sh("ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        sh("ip", "-n", host.ns, "link", "set", "eth0", "up")
        self.hosts[name] = host
        return host

    # -- processes --------------------------------------------------------------------------

    def spawn(self, host: Host, name: str, argv: list[str],
              env: dict[str, str] | None = None) -> Proc:
        """`ip netns exec` execs the command itself, so the process is the role (and, in a
        session of its own, the leader of a group that holds a learner's data process too)."""
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(host.cmd(*argv), stdout=out, stderr=subprocess.STDOUT,
                                     env={**marked_env(self.marker), **(env or {})},
                                     cwd=REPO, start_new_session=True)
        proc = Proc(name, host, popen, log)
        self.procs.append(proc)
        return proc

    def leftovers(self) -> list[int]:
        """Processes this run started (or their children) still alive."""
        return marked_pids(self.marker)

    # -- faults -----------------------------------------------------------------------------

    def shape(self, delay_ms: float, loss: float) -> str:
        """Every host's link delays what the host sends by `delay_ms` and loses `loss` of
        it. Returns how: "netem", or "relay" where the kernel has no netem."""
        assert self.shaping is None, "already shaped"
        hosts = list(self.hosts.values())
        if os.environ.get("RLFLEET_NETNS_SHAPING") != "relay" and shutil.which("tc"):
            try:
                for host in hosts:
                    sh(*host.cmd("tc", "qdisc", "add", "dev", "eth0", "root", "netem",
                                 "delay", f"{delay_ms:g}ms", "loss", f"{loss * 100:g}%"))
                self.shaping = "netem"
                return self.shaping
            except NetError as err:
                if "unknown" not in str(err).lower():  # not "no netem here": a real error
                    raise
                for host in hosts:
                    sh(*host.cmd("tc", "qdisc", "del", "dev", "eth0", "root"), check=False)
        self._start_relay(hosts, delay_ms, loss)
        self.shaping = "relay"
        return self.shaping

    def _start_relay(self, hosts: list[Host], delay_ms: float, loss: float) -> None:
        ports = [h.port for h in hosts]
        for port in ports:  # the relay forwards between them now, not the bridge
            sh("ip", "-n", self.switch, "link", "set", port, "nomaster")
        switch = Host("switch", self.switch, "", "")
        relay = self.spawn(switch, "relay", [sys.executable, str(RELAY), "--delay-ms",
                                             f"{delay_ms:g}", "--loss", f"{loss:g}", *ports])

        def started() -> bool:
            if not relay.alive():
                raise NetError(f"the relay exited:\n{relay.tail()}")
            return "relaying" in relay.tail(5)

        wait_for(started, 10, "the relay to open its ports", interval=0.05)

    def cut(self, host: Host, peers: list[Host]) -> None:
        """A silent partition between `host` and each of `peers`: both sides drop on input
        what the other sends, so connections stall as over a dead link."""
        self._drop_from(host, [p.ip for p in peers])
        for peer in peers:
            self._drop_from(peer, [host.ip])

    def _drop_from(self, host: Host, ips: list[str]) -> None:
        rules = (f"table inet {FAULT_TABLE} {{\n"
                 f"  chain input {{\n"
                 f"    type filter hook input priority -10; policy accept;\n"
                 f"    ip saddr {{ {', '.join(ips)} }} drop\n"
                 f"  }}\n"
                 f"}}\n")
        sh(*host.cmd("nft", "-f", "-"), stdin=rules)
        self.cut_in.add(host.ns)

    def heal(self, check: bool = True) -> None:
        for ns in sorted(self.cut_in):
            sh("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", FAULT_TABLE,
               check=check)
        self.cut_in.clear()

    # -- teardown ---------------------------------------------------------------------------

    def close(self, grace_s: float = 20.0) -> list[str]:
        """Stop everything; returns the processes that had to be killed because SIGTERM
        did not end them within `grace_s` (and anything found left inside a namespace)."""
        if self.cut_in:  # a test that failed mid-fault: let the roles leave properly
            self.heal(check=False)
        stubborn: list[str] = []
        stages: dict[int, list[Proc]] = {}
        for proc in self.procs:
            stages.setdefault(STOP_ORDER.get(proc.name, 0), []).append(proc)
        for _, procs in sorted(stages.items()):
            for proc in procs:
                if proc.alive():  # the leader only: a learner ends its data process itself
                    with contextlib.suppress(ProcessLookupError):
                        proc.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for proc in procs:
                try:
                    proc.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    stubborn.append(proc.name)
                proc.kill_group()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(10)
        for ns in reversed(self.namespaces):
            stubborn += [f"pid {pid} in {ns}" for pid in _kill_inside(ns)]
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()
        return stubborn

    def remaining(self) -> list[str]:
        """Namespaces of this run still present (none, after `close`)."""
        return [line.split()[0] for line in sh("ip", "netns", "list").splitlines()
                if line.startswith(f"{self.tag}-")]


# -- the run under test ----------------------------------------------------------------------

class Cluster:
    """The run, as the test sees it: the coordinator's API reached from inside the
    coordinator's own host (a partition of the coordinator cuts its links, not the test's
    view of it), each worker's own API from inside its host, and the role processes, which
    must never exit on their own."""

    def __init__(self, net: Net, token: str) -> None:
        self.net = net
        self.token = token
        self.roles: dict[str, Proc] = {}
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"

    @property
    def coordinator(self) -> Host:
        return self.net.hosts["coordinator"]

    @property
    def redis(self) -> Host:
        return self.net.hosts["redis"]

    @property
    def url(self) -> str:
        return f"http://{self.coordinator.ip}:{COORDINATOR_PORT}"

    @property
    def storage(self) -> str:
        return f"redis://{self.redis.ip}:{REDIS_PORT}/0"

    def _get(self, host: Host, url: str) -> dict:
        with host.inside():
            r = self.http.get(url, timeout=3)
        r.raise_for_status()
        return r.json()

    def get(self, path: str) -> dict:
        return self._get(self.coordinator, f"{self.url}{API}{path}")

    def status(self) -> dict:
        return self.get("/status")

    def own_status(self, worker_id: str) -> dict:
        """A worker's own `/status`, asked on its host."""
        host = self.net.hosts[worker_id]
        return self._get(host, f"http://{host.ip}:{WORKER_PORT}/status")

    def worker(self, status: dict, worker_id: str) -> dict | None:
        return next((w for w in status["workers"] if w["worker_id"] == worker_id), None)

    def exited(self) -> dict[str, str]:
        """Roles whose process ended, with the end of each one's log."""
        return {name: f"exit {p.popen.returncode}:\n{p.tail()}"
                for name, p in self.roles.items() if not p.alive()}

    # -- starting the roles, each on its own host ----------------------------------------------

    def _env(self) -> dict[str, str]:
        return {"RLFLEET_TOKEN": self.token, "RLFLEET_LOG_LEVEL": "INFO"}

    def start_redis(self) -> None:
        """No persistence: this suite cuts links, it never restarts Redis."""
        host = self.redis
        self.roles["redis"] = self.net.spawn(host, "redis", [
            "redis-server", "--bind", host.ip, "--port", str(REDIS_PORT), "--save", "",
            "--appendonly", "no", "--protected-mode", "no", "--dir", str(self.net.workdir)])
        wait_for(lambda: self.redis.handshake_s(host.ip, REDIS_PORT, timeout=2), 20,
                 "redis-server to listen")

    def start_coordinator(self, config: Path, run_dir: Path) -> None:
        host = self.coordinator
        self.roles["coordinator"] = self.net.spawn(host, "coordinator", [
            str(RLFLEET), "coordinator", "--host", host.ip, "--port", str(COORDINATOR_PORT),
            "--config", str(config), "--storage", self.storage, "--run-dir", str(run_dir)],
            self._env())

        def healthy() -> bool:
            if self.exited():
                raise AssertionError(f"a role exited while starting: {self.exited()}")
            return self._get(host, f"{self.url}/health")["ok"]

        wait_for(healthy, 90, "the coordinator to answer /health")

    def start_worker(self, role: str, worker_id: str) -> None:
        """No --storage: the worker uses the storage URL the coordinator announces."""
        host = self.net.hosts[worker_id]
        self.roles[worker_id] = self.net.spawn(host, worker_id, [
            str(RLFLEET), role, "--coordinator", self.url, "--host", host.ip,
            "--port", str(WORKER_PORT), "--advertise-url", f"http://{host.ip}:{WORKER_PORT}",
            "--worker-id", worker_id], self._env())


@dataclass
class Watch(Monitor):
    """The chaos suite's monitor (in every status answer: a balanced ledger, no chunk
    indexed twice, acknowledged chunks never fewer), plus policy versions that never go
    down."""

    highest_version: int = -1

    def check(self, s: dict) -> None:
        super().check(s)
        version = s["counters"]["policy_version"]
        if version < self.highest_version:
            self.violations.append(f"policy version went from {self.highest_version} to "
                                   f"{version}")
        self.highest_version = max(self.highest_version, version)
