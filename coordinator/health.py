"""What a run's user must be told even when every request succeeds: alerts.

Two things go wrong quietly in a running cluster. A learner's loss goes NaN (the learner
drops such values from its reports and counts them, `learner/observe/metric_window.py`), and the run
trains on while its curves simply stop; or the learner waits for data for a long time (no
collector, a rate limit that never opens), which only ever showed as a timer. `RunHealth`
turns both into alerts: `GET /status`'s `alerts`, which `rlfleet status`, the dashboard and
`summary.json` show. Non-finite counts are the coordinator's since it started (a restarted
coordinator counts again from the learner's next reports).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping

from rlfleet.coordinator.membership import Membership
from rlfleet.shared.contract.wire.base import Role, WorkerState
from rlfleet.shared.contract.wire.status import Alert

DATA_WAIT_KEY = "data_wait_s"  # a learner's heartbeat status: seconds waiting for data now


class RunHealth:
    def __init__(self, data_shortage_warn_s: float) -> None:
        self.data_shortage_warn_s = data_shortage_warn_s
        self._lock = threading.Lock()
        self._nonfinite: dict[str, int] = defaultdict(int)
        self._first: dict[str, tuple[str, int]] = {}  # key: (worker, train iteration)

    def on_learn_info(self, worker_id: str, train_iterations: int,
                      nonfinite: Mapping[str, int]) -> None:
        with self._lock:
            for key, n in nonfinite.items():
                if n > 0:
                    self._nonfinite[key] += n
                    self._first.setdefault(key, (worker_id, train_iterations))

    @property
    def nonfinite_total(self) -> int:
        return sum(self._nonfinite.values())

    def nonfinite(self) -> dict[str, int]:
        with self._lock:
            return dict(self._nonfinite)

    def alerts(self, members: Membership, collecting: bool = True) -> list[Alert]:
        """`collecting`: False while the run is paused or stopped, when a learner waits for
        data because its user asked it to."""
        out: list[Alert] = []
        with self._lock:
            counts, first = dict(self._nonfinite), dict(self._first)
        if counts:
            worker, iteration = min(first.values(), key=lambda f: f[1])
            keys = ", ".join(f"{k} ({n})" for k, n in sorted(counts.items()))
            out.append(Alert(kind="nonfinite_metrics", worker_id=worker,
                             train_iteration=iteration, metrics=counts,
                             message=f"learner metrics went NaN or infinite: {keys} values "
                                     f"dropped, first at train iteration {iteration}"))
        for w in members.all():
            waited = w.status.get(DATA_WAIT_KEY, 0.0)
            if (collecting and w.role is Role.LEARNER and w.state is WorkerState.ALIVE
                    and waited >= self.data_shortage_warn_s):
                out.append(Alert(kind="data_shortage", worker_id=w.worker_id,
                                 waited_s=round(waited, 1),
                                 message=f"learner {w.worker_id} has waited {waited:.0f} s for "
                                         "data (learner.data_shortage_warn_s="
                                         f"{self.data_shortage_warn_s:g}): are collectors "
                                         "running, and does the rate limit let it sample?"))
        return out
