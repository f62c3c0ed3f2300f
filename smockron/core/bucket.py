"""The textbook token bucket: a capacity (``burst``), a continuous refill ``rate``, and
requests that take tokens. DThrottle calls it a "leaky bucket"; it runs the DThrottle
front. Named for its refill so as not to read as the cluster's TOKEN_BUCKET
(Gubernator's, a fixed window) nor its LEAKY_BUCKET (kept in exact integer units):
those are in core/algorithms.py.

The balance may go below zero when hits reported by peers are subtracted (DThrottle),
which then delays refill. Times are in seconds or milliseconds as long as ``rate`` uses
the same unit; floats, so not for exact oracles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

EPSILON: Final = 1e-9
"""Tokens a float sum may miss by (a debt of 3 refilled over exactly 3 s)."""


@dataclass(slots=True)
class RefillBucket:
    """``tokens`` as of ``updated``; refill at ``rate`` per time unit up to ``burst``."""

    burst: float
    rate: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, burst: float, rate: float, now: float) -> RefillBucket:
        return cls(burst, rate, float(burst), now)

    def refill(self, now: float) -> float:
        """Bring the balance up to ``now`` and return it. A clock going back refills nothing."""
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
        return self.tokens

    def try_take(self, now: float, n: float = 1.0) -> bool:
        """Take ``n`` tokens if the balance holds them; a refusal costs nothing.

        Whole tokens, as in the original DThrottle's worked example: a bucket of 10 serves
        10 queries, whether they come in one write or a few milliseconds apart (taking
        while merely positive served an 11th on the sliver refilled meanwhile)."""
        if self.refill(now) >= n - EPSILON:
            self.tokens -= n
            return True
        return False

    def subtract(self, now: float, n: float) -> None:
        """Remove ``n`` tokens unconditionally; the balance may go negative."""
        self.refill(now)
        self.tokens -= n

    def is_full(self, now: float) -> bool:
        return self.refill(now) >= self.burst

    def time_until(self, now: float, n: float = 1.0) -> float:
        """How long until ``n`` tokens are available (0 when they are now)."""
        missing = n - self.refill(now)
        return missing / self.rate if missing > 0 else 0.0
