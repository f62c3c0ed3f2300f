"""The circuit breaker in front of a persisting store: pure logic, the clock passed in.

A backend that stops answering (Redis SIGSTOPped, a network black hole) must cost the
master one call timeout, not one per batch: after a failure the breaker is **open** and
the master decides from memory without calling the backend; after ``retry_s`` it is
**half-open** and the next call is a probe; a probe that succeeds **closes** it (the
store then writes what changed meanwhile), one that fails opens it again.

Each transition is logged once (a long outage probes every ``retry_s``: those
repeated open/half-open lines are rate-limited, the count is in the metrics) and
counted per target state for ``smockron_master_store_breaker_transitions_total``.
"""

from __future__ import annotations

import logging
from collections import Counter
from enum import IntEnum

from smockron.ratelog import RateLimitedLog, escaped

_log = logging.getLogger("smockron.master.store")


class BreakerState(IntEnum):
    """The gauge's values: ``smockron_master_store_breaker_state``."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


class Breaker:
    """Closed -> open on a failure; open -> half-open after ``retry_s``; half-open ->
    closed on a success, or open again on a failure. ``now`` is monotonic seconds."""

    def __init__(self, name: str, retry_s: float = 1.0, logger: logging.Logger = _log) -> None:
        self.name = name
        self.retry_s = retry_s
        self.state = BreakerState.CLOSED
        self.transitions: Counter[str] = Counter()
        """Transitions by the state entered (``open``, ``half_open``, ``closed``)."""
        self.failures = 0
        self.down_since: float | None = None
        """When the backend stopped answering, or None while it answers."""
        self._retry_at = 0.0
        self._log = logger
        self._repeat = RateLimitedLog(logger, interval=60.0, burst=1)

    def allow(self, now: float) -> bool:
        """Whether the backend may be called now; an open breaker whose retry time has
        come turns half-open and lets this call through as the probe."""
        if self.state is BreakerState.OPEN:
            if now < self._retry_at:
                return False
            self._enter(BreakerState.HALF_OPEN)
            down = now - (self.down_since or now)
            self._repeat.warning(
                "store %s breaker half-open: probing after %.1f s", self.name, down, key="probe"
            )
        return True

    def failure(self, now: float, what: str, exc: BaseException) -> None:
        """A call failed (or timed out): open, and stay open ``retry_s``."""
        self.failures += 1
        self._retry_at = now + self.retry_s
        if self.state is BreakerState.OPEN:
            return  # a write started before the breaker opened: already counted
        reason = escaped(str(exc) or type(exc).__name__)
        if self.state is BreakerState.CLOSED:
            self.down_since = now
            self._log.warning(
                "store %s breaker open (%s failed: %s): going on from memory, probing every %g s",
                self.name,
                what,
                reason,
                self.retry_s,
            )
        else:
            self._repeat.warning(
                "store %s breaker open again: probe failed (%s: %s)",
                self.name,
                what,
                reason,
                key="reopen",
            )
        self._enter(BreakerState.OPEN)

    def success(self, now: float) -> float | None:
        """A call answered: closed. Returns how long the backend was down when this
        closed the breaker (the caller logs "reconnected" with what it reconciles)."""
        if self.state is BreakerState.CLOSED:
            return None
        down = now - (self.down_since or now)
        self.down_since = None
        self._enter(BreakerState.CLOSED)
        return down

    def _enter(self, state: BreakerState) -> None:
        self.state = state
        self.transitions[state.name.lower()] += 1
