"""Whether a worker's own HTTP service still answers at the URL it registered with.

The coordinator asks when its heartbeats cannot tell yet: a learner group's rank reported a
failed collective (is the other rank dead, or only slow?), or a worker id is registered from
a new URL while the old entry is still within its heartbeat timeout (a restart, or a second
process under the same id?). The answer has three values because the two questions treat
silence differently: a hung process (SIGSTOP) does not answer within the timeout, a process
that is gone leaves nothing listening at its address.
"""

from __future__ import annotations

from enum import StrEnum

import requests

from rlfleet.shared.infra import inproc

PROBE_TIMEOUT_S = 1.0


class Liveness(StrEnum):
    ANSWERS = "answers"  # `GET /health` answered 2xx
    SILENT = "silent"    # no answer to trust in time: hung, overloaded, far away, bad TLS
    GONE = "gone"        # nothing listens there (refused, unknown host), or something else does


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> Liveness:
    """`GET <url>/health` once, no retry: `/health` is open (no token), and cheap to answer.
    An app of this process (`inproc`) answers while it is served."""
    if inproc.is_inproc(url):
        return Liveness.ANSWERS if inproc.app_at(url) is not None else Liveness.GONE
    try:
        resp = requests.get(f"{url.rstrip('/')}/health", timeout=timeout_s,
                            allow_redirects=False)
    except requests.Timeout:  # before ConnectionError: a connect timeout is both
        return Liveness.SILENT
    except requests.exceptions.SSLError:  # something speaks TLS there; it cannot be trusted
        return Liveness.SILENT
    except requests.RequestException:
        return Liveness.GONE
    with resp:
        return Liveness.ANSWERS if 200 <= resp.status_code < 300 else Liveness.GONE
