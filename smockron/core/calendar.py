"""Calendar windows for ``DURATION_IS_GREGORIAN``: the UTC minute, hour, day, week,
month or year that contains a moment.

Gubernator numbers them 0..5 (``GregorianMinutes`` .. ``GregorianYears``). A window is
half-open, ``[start, end)`` in epoch milliseconds: at ``end`` the next one begins. Weeks
start on Monday 00:00 UTC (ISO 8601). Months and years have their true lengths, computed
on the proleptic Gregorian calendar in integers (not ``datetime``, which stops at year
9999: a client's ``created_at`` may be any int64, and Gubernator's Go time takes it).
"""

from __future__ import annotations

from enum import IntEnum


class Gregorian(IntEnum):
    MINUTES = 0
    HOURS = 1
    DAYS = 2
    WEEKS = 3
    MONTHS = 4
    YEARS = 5


_FIXED_MS = {Gregorian.MINUTES: 60_000, Gregorian.HOURS: 3_600_000, Gregorian.DAYS: 86_400_000}
_DAY_MS = 86_400_000
_WEEK_MS = 7 * _DAY_MS
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
    year, month = _year_month(now_ms // _DAY_MS)
    if unit is Gregorian.MONTHS:
        begin = _days(year, month)
        end = _days(year + month // 12, month % 12 + 1)
    else:
        begin, end = _days(year, 1), _days(year + 1, 1)
    return begin * _DAY_MS, end * _DAY_MS


def _days(year: int, month: int) -> int:
    """Days from 1970-01-01 to the first of ``month`` (1..12) of ``year`` (H. Hinnant's
    days_from_civil, exact for any year)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5
    return era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468


def _year_month(days: int) -> tuple[int, int]:
    """``(year, month)`` of the day ``days`` after 1970-01-01 (civil_from_days)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (month <= 2), month
