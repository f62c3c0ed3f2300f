"""A logger that cannot be flooded: hostile input must not turn into a disk-filling log.

Every network-facing part of smockron logs malformed input through this one class.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escaped(value: object) -> object:
    """``value`` for a log line: text (and exceptions, bytes) with every control
    character written as an escape, so hostile input cannot forge lines (newline, CR),
    drive a terminal (ESC) or cut a line (NUL). Numbers pass unchanged."""
    if isinstance(value, int | float) or value is None:
        return value
    return escape_controls(repr(value) if isinstance(value, bytes) else str(value))


def escape_controls(text: str) -> str:
    """``text`` with every control character (and U+2028/9) written as its escape."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


@dataclass
class _Window:
    start: float
    emitted: int = 0
    suppressed: int = 0


class RateLimitedLog:
    """At most ``burst`` lines per ``interval`` seconds for each ``key``.

    Lines over the limit are counted, and the first line written after the window ends
    says how many were dropped (`` (N similar messages suppressed)``), so nothing is lost
    silently. Keys let unrelated problems be limited independently; callers that do not
    pass one share a single limit. The clock is injectable so the limit is tested exactly.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 10.0,
        burst: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.burst = burst
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    def warning(self, msg: str, *args: object, key: str = "") -> bool:
        """Log ``msg % args`` unless ``key`` is over its limit; True when it was written."""
        now = self.clock()
        window = self._windows.get(key)
        suffix = ""
        if window is None or now - window.start >= self.interval:
            if window is not None and window.suppressed:
                suffix = f" ({window.suppressed} similar messages suppressed)"
            window = self._windows[key] = _Window(start=now)
        if window.emitted >= self.burst:
            window.suppressed += 1
            return False
        window.emitted += 1
        self.logger.warning(msg + suffix, *(escaped(arg) for arg in args))
        return True

    def suppressed(self, key: str = "") -> int:
        """Lines dropped for ``key`` in its current window (for tests and metrics)."""
        window = self._windows.get(key)
        return window.suppressed if window is not None else 0
