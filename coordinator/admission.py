"""Which workers the coordinator accepts at registration: their URLs
(`coordinator.worker_networks`) and their devices (`learner.device`, `collector.device`).

The coordinator POSTs tasks to the URL a worker registers with, so an open registration
would let anyone who can reach the API point the coordinator at any address it can reach
(a cloud metadata service at 169.254.169.254, a host outside the cluster). With networks
configured, a worker's URL must name a host whose every address lies inside one of them; a
host name is resolved at registration. No networks (the local default) means any address.

A config that asks for CUDA (`cuda`, or `cuda:N`) refuses a worker of that role whose reported
resources hold no such GPU (`DeviceMissing`, answered 409), naming the field, the worker and
its host: the run would fail on it anyway, later and less clearly. A worker that reports no
resources (an older one) is not checked, nor is `auto` or `cpu`.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from rlfleet.shared.contract.config import cuda_devices_needed
from rlfleet.shared.contract.wire.membership import RegisterRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolve = Callable[[str], list[str]]


class NotAdmitted(ValueError):
    """A registration whose URL is outside the allowed networks (answered 403)."""

    field = "url"


class DeviceMissing(ValueError):
    """A registration from a worker without the GPU its role's `device` asks for (409)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


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


def check_device(device: str, field: str, req: RegisterRequest) -> None:
    """Raise `DeviceMissing` when `device` (the config's `field`: `cuda` or `cuda:N`) names
    a GPU the registering worker reports it lacks."""
    res = req.resources
    if res is None or len(res.gpus) >= cuda_devices_needed(device):
        return
    role = req.role.value
    who = f"{role} {req.worker_id}" if req.worker_id else f"{role} at {req.url}"
    has = ("no CUDA device" if not res.gpus else
           f"only {len(res.gpus)} CUDA device{'s' if len(res.gpus) > 1 else ''} "
           f"(cuda:0{f'..cuda:{len(res.gpus) - 1}' if len(res.gpus) > 1 else ''})")
    raise DeviceMissing(f"{field}={device!r} but {who} on host {res.hostname} has {has}; "
                        f"set {field} to cpu or auto, or run this {role} where there is one",
                        field)
