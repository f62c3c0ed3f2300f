"""The seed's rate-limiting rule, exactly as ``smockron-readme.txt`` states it.

If the number of requests in the past ``burst / rate`` is less than ``burst``, another
request is acceptable now. Otherwise let ``start`` be the greater of now and the last
timestamp in the history; the next request is allowed at ``start + 1 / rate``.

The history holds the receive timestamp of accepted requests and the delayed timestamp
of delayed ones, and never more than ``burst`` timestamps. Times are milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from smockron.core.rules import Rule

History = list[float]
"""Timestamps in arrival order, oldest first, at most ``rule.burst`` of them."""


def recorded(history: Sequence[float], timestamp: float, rule: Rule) -> tuple[float, ...]:
    """``history`` plus ``timestamp``, without the oldest entries beyond ``rule.burst``.

    A new tuple rather than a list changed in place: the master stores tuples because
    CPython's garbage collector stops tracking a tuple of floats, so a million stored
    histories add nothing to a full collection (as lists they cost it a long pause:
    docs/benchmarks.md).
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


def served_at(
    rules: Sequence[Rule], states: Sequence[Sequence[float]], ts: float, ahead: float
) -> float:
    """When a request at ``ts`` should have been served given the stored ``states`` (one
    per rule): the next allowed time the rules had computed after their newest entry, if
    that is later.

    That time is the newest entry plus one interval when the history is full (its
    ``burst`` entries all within one window of the newest), which is exactly when the
    master published a DELAY_UNTIL for it; a gatekeeper obeying that DELAY_UNTIL sends
    nothing before it. Debt reaches at most ``ahead`` past ``ts``, as a DELAYED timestamp
    may (the master's ``max_delay_ahead_ms``): forged ACCEPTED messages hold no longer
    than forged DELAYED ones.
    """
    due = ts
    for rule, state in zip(rules, states, strict=True):
        if len(state) >= rule.burst:
            nxt = state[-1] + rule.interval_ms
            if nxt > due and min(state) > state[-1] - rule.window_ms:
                due = nxt
    return due if due - ts <= ahead else ts + ahead


def verdict_of(
    rules: Sequence[Rule], states: Sequence[Sequence[float]], gcra: bool
) -> float | None:
    """The DELAY_UNTIL the master last published for these states (one per rule), if
    any: the latest of the rules'. A RESYNC answers with it."""
    until: float | None = None
    for rule, state in zip(rules, states, strict=True):
        nxt = rule_verdict(rule, state, gcra)
        if nxt is not None and (until is None or nxt > until):
            until = nxt
    return until


def rule_verdict(rule: Rule, state: Sequence[float], gcra: bool) -> float | None:
    """One rule's last DELAY_UNTIL for a state. GCRA: the value; a history: its newest
    entry plus one interval when it is full (``burst`` entries within one window of the
    newest)."""
    if not state:
        return None
    if gcra:
        return state[0]
    if len(state) >= rule.burst and min(state[-rule.burst :]) > state[-1] - rule.window_ms:
        return state[-1] + rule.interval_ms
    return None


def verdicts_after(
    rule: Rule, pairs: Sequence[tuple[bytes, Sequence[float]]], gcra: bool, now: float
) -> list[tuple[bytes, int]]:
    """:func:`verdict_of` for one rule over many identifiers, in one comprehension:
    those whose verdict is after ``now``, as ``(identifier, until ms)``."""
    ceil, verdict = math.ceil, rule_verdict
    return [
        (ident, ceil(until))
        for ident, state in pairs
        if (until := verdict(rule, state, gcra)) is not None and until > now
    ]
