"""JARL's algorithm: how long must a caller wait before its next request?

The original keeps ONE queue of arrival times and ONE counter for the whole process (not
per client). Once the queue holds ``requests + 1`` arrivals the oldest is dropped; when it
arrived less than ``period`` ago the caller must wait for it to age out, plus
``base_delay`` for every caller that has already been told to wait, so that the waiting
callers spread out instead of all firing when the window reopens. Pure: ``now`` is an
argument, in seconds.
"""

from __future__ import annotations

from collections import deque

from smockron.errors import ConfigError

MIN_BASE_DELAY = 0.01


class Jarl:
    """The delay oracle of one JARL process (one service, one rate limit)."""

    def __init__(self, requests: int, period: int) -> None:
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
            raise ConfigError(f"requests must be a whole number >= 1, got {requests!r}")
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ConfigError(f"period must be a whole number of seconds >= 1, got {period!r}")
        self.requests = requests
        self.period = period
        self.base_delay = max(period / requests, MIN_BASE_DELAY)
        self.counter = 0
        self._arrivals: deque[float] = deque()

    def retuned(self, requests: int, period: int) -> Jarl:
        """A Jarl with another limit that remembers the recent arrivals (the newest
        ``requests`` of them), so a reload does not hand out a fresh burst."""
        other = Jarl(requests, period)
        other._arrivals.extend(list(self._arrivals)[-requests:])
        return other

    def delay(self, now: float) -> float:
        """Record an arrival at ``now`` and return the seconds it must wait (0.0 for none)."""
        arrivals = self._arrivals
        arrivals.append(now)
        if len(arrivals) <= self.requests:
            return 0.0
        diff = now - arrivals.popleft()
        if diff < self.period:
            self.counter += 1
            return self.base_delay * self.counter + (self.period - diff)
        self.counter = 0
        return 0.0


def format_delay(seconds: float) -> bytes:
    """The wire answer: the delay with exactly three decimals and no newline."""
    return b"%.3f" % seconds
