"""Counting and logging hostile input without letting it flood the log."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """At most one line per ``interval`` seconds, saying how many were suppressed."""

    def __init__(self, logger: logging.Logger, interval: float = 1.0) -> None:
        self._logger = logger
        self._interval = interval
        self._last = -interval
        self._suppressed = 0

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self._interval:
            self._suppressed += 1
            return
        extra = f" ({self._suppressed} similar suppressed)" if self._suppressed else ""
        self._last, self._suppressed = now, 0
        self._logger.warning(msg + extra, *args)
