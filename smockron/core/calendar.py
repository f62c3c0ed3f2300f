"""Calendar windows for ``DURATION_IS_GREGORIAN``: the UTC minute, hour, day, week,
month or year that contains a moment.

Gubernator numbers them 0..5 (``GregorianMinutes`` .. ``GregorianYears``). A window is
half-open, ``[start, end)`` in epoch milliseconds: at ``end`` the next one begins. Weeks
start on Monday 00:00 UTC (ISO 8601). Months and years have their true lengths.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import IntEnum


class Gregorian(IntEnum):
    MINUTES = 0
    HOURS = 1
    DAYS = 2
    WEEKS = 3
    MONTHS = 4
    YEARS = 5


_FIXED_MS = {Gregorian.MINUTES: 60_000, Gregorian.HOURS: 3_600_000, Gregorian.DAYS: 86_400_000}
_WEEK_MS = 7 * 86_400_000
_MONDAY_OFFSET_MS = 4 * 86_400_000  # 1970-01-01 was a Thursday; 1970-01-05 a Monday


def is_gregorian(duration: int) -> bool:
    return 0 <= duration <= 5


def window(now_ms: int, interval: int) -> tuple[int, int]:
    """``(start, end)`` of the calendar ``interval`` (0..5) containing ``now_ms``."""
    unit = Gregorian(interval)
    fixed = _FIXED_MS.get(unit)
    if fixed is not None:
        start = now_ms - now_ms % fixed
        return start, start + fixed
    if unit is Gregorian.WEEKS:
        start = now_ms - (now_ms - _MONDAY_OFFSET_MS) % _WEEK_MS
        return start, start + _WEEK_MS
    moment = datetime.fromtimestamp(now_ms // 1000, UTC)
    if unit is Gregorian.MONTHS:
        begin = datetime(moment.year, moment.month, 1, tzinfo=UTC)
        year, month = divmod(moment.year * 12 + moment.month, 12)
        end = datetime(year, month + 1, 1, tzinfo=UTC)
    else:
        begin = datetime(moment.year, 1, 1, tzinfo=UTC)
        end = datetime(moment.year + 1, 1, 1, tzinfo=UTC)
    return _ms(begin), _ms(end)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp()) * 1000
