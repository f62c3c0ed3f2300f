"""The seed's rate-limiting rule, exactly as ``smockron-readme.txt`` states it.

If the number of requests in the past ``burst / rate`` is less than ``burst``, another
request is acceptable now. Otherwise let ``start`` be the greater of now and the last
timestamp in the history; the next request is allowed at ``start + 1 / rate``.

The history holds the receive timestamp of accepted requests and the delayed timestamp
of delayed ones, and never more than ``burst`` timestamps. Times are milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from smockron.core.rules import Rule

History = list[float]
"""Timestamps in arrival order, oldest first, at most ``rule.burst`` of them."""


def recorded(history: Sequence[float], timestamp: float, rule: Rule) -> tuple[float, ...]:
    """``history`` plus ``timestamp``, without the oldest entries beyond ``rule.burst``.

    A new tuple rather than a list changed in place: the master stores tuples because
    CPython's garbage collector stops tracking a tuple of floats, so a million stored
    histories add nothing to a full collection (as lists they cost it ~120 ms).
    """
    start = len(history) - rule.burst + 1
    return (*history[start:], timestamp) if start > 0 else (*history, timestamp)


def record(history: History, timestamp: float, rule: Rule) -> None:
    """:func:`recorded`, in place, for a working list."""
    history[:] = recorded(history, timestamp, rule)


def next_allowed(history: Sequence[float], now: float, rule: Rule) -> float | None:
    """When the next request is allowed, or ``None`` when it is acceptable right now."""
    if len(history) < rule.burst:
        return None
    horizon = now - rule.window_ms
    recent = 0
    for ts in history:
        if ts > horizon:
            recent += 1
    if recent < rule.burst:
        return None
    start = max(now, history[-1])
    return start + rule.interval_ms


def expires_at(history: Sequence[float], rule: Rule) -> float:
    """The time after which this history can no longer throttle anything."""
    return max(history) + rule.window_ms if history else 0.0
