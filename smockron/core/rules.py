"""Rules: a rate (requests per period) and a burst.

Rates are written ``RATE/UNIT`` with units ``s``, ``m``, ``h``, ``d`` (``10/s``, ``5/m``).
The original Node.js master's spellings (``3/sec``, ``3 per sec``, ``100 per minute``)
are accepted too, so its YAML configuration can be read unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from smockron.errors import RuleError

_UNIT_SECONDS: dict[str, float] = {
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}  # fmt: skip

# ASCII digits only: int() and float() would also take "1_0" or Arabic-Indic digits.
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/|\s+per\s+)\s*([a-zA-Z]+)\s*$", re.ASCII)
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
    count, unit = match.groups()
    seconds = _UNIT_SECONDS.get(unit.lower())
    if seconds is None:
        raise RuleError(f"unknown time unit {unit!r} in rate {text!r}: use s, m, h or d")
    rate = float(count) / seconds
    if rate <= 0:
        raise RuleError(f"rate must be positive, got {text!r}")
    return rate


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
