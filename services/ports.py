"""Free TCP ports, for a process that needs one before it starts: a role whose port is not
given, and every child `rlfleet up` starts on the loopback interface."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now. The socket is closed before the port is used, so another
    process may take it first; callers that start a server on it learn so when it fails."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
