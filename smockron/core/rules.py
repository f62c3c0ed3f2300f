"""Rules: a rate (requests per period) and a burst.

Rates are written ``RATE/UNIT`` with units ``s``, ``m``, ``h``, ``d`` (``10/s``, ``5/m``).
The original Node.js master's spellings (``3/sec``, ``3 per sec``, ``100 per minute``,
a period with a count, ``1/2s`` or ``5/10min``, and ``ms``) are accepted too.

The original master turns a rate into a whole number of milliseconds between requests
(``Math.round(period / count)``) and a burst into milliseconds of tolerance; its YAML
is read with that arithmetic, reproduced by ``original_interval_ms`` (``parseInterval``)
and ``original_rate_interval_ms`` (``parseRate``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from smockron.core.vocabulary import ALGORITHMS as ALGORITHMS  # the names: vocabulary.py
from smockron.errors import RuleError

_UNIT_SECONDS: dict[str, float] = {
    "ms": 0.001,
    "msec": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}

# ASCII digits only: int() and float() would also take "1_0" or Arabic-Indic digits.
_RATE_RE = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(?:/|\s+per\s+)\s*(\d+(?:\.\d+)?)?\s*([a-zA-Z]+)\s*$", re.ASCII
)
_BURST_RE = re.compile(r"^\s*(\d+)\s*$", re.ASCII)


@dataclass(frozen=True, slots=True)
class Rule:
    """``rate`` requests per second, after a burst of ``burst`` requests."""

    rate: float
    burst: int

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise RuleError(f"rate must be > 0, got {self.rate!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise RuleError(f"burst must be an integer >= 1, got {self.burst!r}")

    @property
    def interval_ms(self) -> float:
        """Milliseconds between two requests at the sustained rate (``1 / rate``)."""
        return 1000.0 / self.rate

    @property
    def window_ms(self) -> float:
        """The history window, ``burst / rate``, in milliseconds."""
        return self.burst * 1000.0 / self.rate

    def __str__(self) -> str:
        return f"{self.rate:g}/s:{self.burst}"


def parse_rate(text: str) -> float:
    """Parse ``10/s``, ``5/m``, ``3/sec`` or ``3 per sec`` into requests per second."""
    match = _RATE_RE.match(text)
    if match is None:
        raise RuleError(f"cannot parse rate {text!r}: expected RATE/UNIT such as '10/s' or '5/m'")
    count, periods, unit = match.groups()
    seconds = _UNIT_SECONDS.get(unit.lower())
    if seconds is None:
        raise RuleError(f"unknown time unit {unit!r} in rate {text!r}: use s, m, h or d")
    if periods is not None:  # "1/2s": one per two seconds
        seconds *= float(periods)
    rate = float(count) / seconds if seconds > 0 else 0.0
    if rate <= 0:
        raise RuleError(f"rate must be positive, got {text!r}")
    return rate


# The original master's parseInterval and parseRate, as written (case-sensitive units,
# whole numbers; a bare number is milliseconds, and so is an empty unit).
_ORIGINAL_MS: dict[str, int] = {
    "": 1,
    "ms": 1,
    "msec": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hr": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_ORIGINAL_INTERVAL_RE = re.compile(r"\s*(\d+)?\s*(" + "|".join(_ORIGINAL_MS) + r")\s*", re.ASCII)
_ORIGINAL_RATE_RE = re.compile(r"\s*(\d+)\s*(?:per|/)\s*(.*)", re.ASCII)


def original_interval_ms(value: object) -> float:
    """The original master's ``parseInterval``: a number is milliseconds as it is;
    ``"2s"``, ``"10 min"``, ``"500"`` (ms), ``"sec"`` (one second)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _ORIGINAL_INTERVAL_RE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise RuleError(
            f"cannot parse interval {value!r}: expected a number of milliseconds or "
            "COUNT UNIT such as '2s' or '10min' (units ms, s, sec, m, min, h, d ...)"
        )
    count, unit = match.groups()
    return float((int(count) if count else 1) * _ORIGINAL_MS[unit])


def js_round(value: float) -> float:
    """JavaScript's ``Math.round``: the nearest integer, halves towards +infinity."""
    floor = math.floor(value)
    return float(floor + 1 if value - floor >= 0.5 else floor)


def original_rate_interval_ms(text: str) -> float | None:
    """The original master's ``parseRate``: ``Math.round(period / count)`` milliseconds
    between requests, e.g. ``"3/sec"`` is 333 ms and ``"5/10min"`` 120000 ms; None
    when the original would not parse ``text`` (it throws "bad rate")."""
    match = _ORIGINAL_RATE_RE.fullmatch(text)
    if match is None:
        return None
    count, period = match.groups()
    try:
        interval = original_interval_ms(period)
    except RuleError:
        return None
    if int(count) == 0:
        raise RuleError(f"rate {text!r} allows no request at all: use a count of 1 or more")
    return js_round(interval / int(count))


def parse_burst(value: object) -> int:
    """A burst from a flag or config value; must be an integer >= 1."""
    match = None if isinstance(value, bool) else _BURST_RE.match(str(value))
    if match is None:
        raise RuleError(f"burst must be an integer >= 1, got {value!r}")
    burst = int(match.group(1))
    if burst < 1:
        raise RuleError(f"burst must be an integer >= 1, got {value!r}")
    return burst


def parse_rule_spec(spec: str) -> tuple[str, Rule]:
    """Parse the ``--rule DOMAIN:RATE/UNIT:BURST`` flag, e.g. ``api:10/s:20``."""
    parts = spec.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        raise RuleError(
            f"cannot parse rule {spec!r}: expected DOMAIN:RATE/UNIT:BURST like api:10/s:20"
        )
    domain, rate, burst = parts
    return domain, Rule(parse_rate(rate), parse_burst(burst))
