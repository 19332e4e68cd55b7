"""Reverb-style rate limiting: a minimum size, and a samples-per-insert ratio with a band.

On a small machine collectors and learners share the CPU, so letting either side run free
does not make training faster; it changes how often each transition is replayed, which is a
hyperparameter. The limiter holds sampled items near `samples_per_insert` x (inserted items
- min_size); a learner may run up to `error_buffer` items ahead of that line and collectors
up to the same amount behind it. Whichever side is outside the band waits (a bounded blocking
request, or 429 with Retry-After); nothing is ever dropped: a collector that is told to wait
has its last chunk accepted first.

The band may be lopsided, as Reverb's (min_diff, max_diff): collectors wait while sampling is
less than `min_lead` items ahead of the line (default `-error_buffer`). Whichever side is
faster sits at its edge of the band. A single process that trains between chunks always sits
at the top (it trains as far as the band allows before collecting again), so a cluster whose
collectors outrun its learner sits `2 x error_buffer` lower with a symmetric band: its
policies are hundreds of updates behind the single process's at the same env step. A
`min_lead` near `error_buffer` keeps the cluster's learner at the top too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RateLimiter:
    min_size: int = 1
    samples_per_insert: float | None = None
    error_buffer: float = 1000.0
    min_lead: float | None = None  # None: -error_buffer

    def target(self, inserted: int) -> float:
        return max(0.0, (inserted - self.min_size) * (self.samples_per_insert or 0.0))

    def grantable_batches(self, batch_items: int, size: int, inserted: int,
                          sampled: int) -> int:
        """Batches of `batch_items` items that may be sampled now."""
        if size < max(1, self.min_size) or inserted < self.min_size:
            return 0
        if self.samples_per_insert is None:
            return 1 << 30
        room = self.target(inserted) + self.error_buffer - sampled
        return max(0, int(room // max(1, batch_items)))

    def inserts_blocked(self, inserted: int, sampled: int) -> bool:
        """True when inserting should wait: samplers are less than `min_lead` items ahead
        of the line (by default: more than `error_buffer` items behind it)."""
        if self.samples_per_insert is None or inserted < self.min_size:
            return False
        lead = -self.error_buffer if self.min_lead is None else self.min_lead
        return sampled < self.target(inserted) + lead
