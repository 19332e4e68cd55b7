"""A userspace switch that delays and drops frames the way `tc netem` would, for kernels
built without `sch_netem` (`CONFIG_NET_SCH_NETEM` unset: `tc` answers "Specified qdisc kind
is unknown"). The hosts-apart suite runs it in its switch namespace in place of the bridge.

Every frame a host sends is dropped with probability `--loss` and otherwise delivered
`--delay-ms` later, in order: what `netem delay D loss L` on the egress of every host's veth
does. Frames go where their destination MAC was last seen (a learning switch), or to every
other port. Sockets carry a virtio-net header (`PACKET_VNET_HDR`), so segmentation-offloaded
super-frames and partial checksums cross intact, as they cross a bridge; netem, on a veth,
also delays and drops such a super-frame as one packet.

    python relay.py --delay-ms 50 --loss 0.01 PORT...

Only the standard library: it runs under any Python 3, outside the test process, so its
work never competes with the test's threads for one interpreter lock.
"""

from __future__ import annotations

import argparse
import collections
import random
import select
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4
VNET_HDR_LEN = 10  # struct virtio_net_hdr, in front of every frame on these sockets
MAX_FRAME = VNET_HDR_LEN + 65_550  # a 64 KiB super-frame plus its Ethernet header


def open_port(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    sock.bind((name, ETH_P_ALL))
    sock.setblocking(False)
    return sock


def relay(ports: list[str], delay_s: float, loss: float, seed: int | None) -> None:
    rng = random.Random(seed)
    socks = [open_port(name) for name in ports]
    by_fd = {s.fileno(): s for s in socks}
    where: dict[bytes, socket.socket] = {}  # MAC -> the port it was last seen on
    # (due, port, frame): one delay for every frame, so due times only grow
    pending: collections.deque[tuple[float, socket.socket, bytes]] = collections.deque()
    counts = collections.Counter()
    stop = False

    def on_term(signum, frame) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    poller = select.epoll()
    for sock in socks:
        poller.register(sock.fileno(), select.EPOLLIN)
    print(f"relaying {ports}: delay {delay_s * 1000:.0f} ms, loss {loss:.2%}", flush=True)
    while not stop:
        timeout = max(0.0, pending[0][0] - time.monotonic()) if pending else 0.5
        try:
            events = poller.poll(timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd, _ in events:
            sock = by_fd[fd]
            while True:
                try:
                    frame, addr = sock.recvfrom(MAX_FRAME)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue
                counts["received"] += 1
                dst = frame[VNET_HDR_LEN:VNET_HDR_LEN + 6]
                where[frame[VNET_HDR_LEN + 6:VNET_HDR_LEN + 12]] = sock
                if rng.random() < loss:
                    counts["lost"] += 1
                    continue
                to = None if dst[0] & 1 else where.get(dst)  # group bit: flood
                for out in ([to] if to is not None else socks):
                    if out is not sock:
                        pending.append((now + delay_s, out, frame))
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            _, out, frame = pending.popleft()
            try:
                out.send(frame)
                counts["sent"] += 1
            except OSError as err:  # a full queue or a port going away: the frame is lost
                counts[f"send failed: {err.strerror}"] += 1
    print(f"relay stopped: {dict(counts)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--loss", type=float, default=0.0, help="probability, 0..1")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("ports", nargs="+")
    args = p.parse_args(argv)
    relay(args.ports, args.delay_ms / 1000, args.loss, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
