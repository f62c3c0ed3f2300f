"""The GCRA form the original master later adopted: one value per key, O(1) memory.

For a message with timestamp ``ts`` seen at ``now``::

    t = max(ts, now)
    V = max(V, t - B) + I          I = 1 / rate,  B = burst * I
    publish DELAY_UNTIL V when V > now
    the state can throttle nothing after V + B (then t - B > V: it is reset anyway)

With ``B = burst * I`` a cold key admits ``burst + 1`` back-to-back requests before the
first DELAY_UNTIL (the history rule admits ``burst``); the sustained rate is the same.
This is the original master's formula, kept as is (see docs/design.md).
"""

from __future__ import annotations

from typing import NamedTuple

from smockron.core.rules import Rule


class GcraResult(NamedTuple):
    value: float
    """The new stored value ``V`` (the theoretical time of the next allowed request)."""
    delay_until: float | None
    """The DELAY_UNTIL timestamp to publish, or None when the next request is allowed now."""


def gcra_update(value: float | None, ts: float, now: float, rule: Rule) -> GcraResult:
    """Account one request; ``value`` is None for a key never seen (or expired)."""
    interval = rule.interval_ms
    tolerance = rule.burst * interval
    t = ts if ts > now else now
    floor = t - tolerance
    base = floor if value is None or value < floor else value
    new_value = base + interval
    return GcraResult(new_value, new_value if new_value > now else None)


def expires_at(value: float, rule: Rule) -> float:
    """When a stored ``V`` can no longer throttle anything: ``V + B``. The one place
    this is computed (stores and the engine call it)."""
    return value + rule.window_ms
