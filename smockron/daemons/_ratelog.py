"""A logger wrapper that drops repeats, so hostile input cannot flood the log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """Log at most one line per ``key`` every ``interval`` seconds, counting the rest."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: object) -> bool:
        """Log ``message`` unless ``key`` was logged recently; True when it was logged."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._suppressed.pop(key, 0)
        suffix = f" ({dropped} similar lines suppressed)" if dropped else ""
        self._logger.warning(message + suffix, *args)
        return True
