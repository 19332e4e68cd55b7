"""Which worker URLs the coordinator accepts at registration (`coordinator.worker_networks`).

The coordinator POSTs tasks to the URL a worker registers with, so an open registration
would let anyone who can reach the API point the coordinator at any address it can reach
(a cloud metadata service at 169.254.169.254, a host outside the cluster). With networks
configured, a worker's URL must name a host whose every address lies inside one of them; a
host name is resolved at registration. No networks (the local default) means any address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolve = Callable[[str], list[str]]


class NotAdmitted(ValueError):
    """A registration whose URL is outside the allowed networks (answered 403)."""

    field = "url"


def parse_networks(cidrs: Sequence[str]) -> list[Network]:
    """CIDRs as networks; host bits set are allowed (`10.1.2.3/8` means `10.0.0.0/8`)."""
    return [ipaddress.ip_network(c.strip(), strict=False) for c in cidrs]


def _resolve(host: str) -> list[str]:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return sorted({str(info[4][0]) for info in infos})


class WorkerNetworks:
    def __init__(self, cidrs: Sequence[str], resolve: Resolve = _resolve) -> None:
        self.networks = parse_networks(cidrs)
        self._resolve = resolve

    def check(self, url: str) -> None:
        """Raise `NotAdmitted` unless every address of `url`'s host is allowed."""
        if not self.networks:
            return
        host = urlsplit(url).hostname
        if not host:
            raise NotAdmitted(f"{url!r} names no host")
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:  # a name: every address it resolves to must be inside
            try:
                addresses = self._resolve(host)
            except OSError as err:
                raise NotAdmitted(f"worker host {host!r} does not resolve: {err}") from None
        allowed = ", ".join(str(n) for n in self.networks)
        for address in addresses:
            ip = ipaddress.ip_address(address)
            ip = getattr(ip, "ipv4_mapped", None) or ip
            if not any(ip.version == n.version and ip in n for n in self.networks):
                raise NotAdmitted(f"worker address {address} ({host}) is outside "
                                  f"coordinator.worker_networks ({allowed})")
