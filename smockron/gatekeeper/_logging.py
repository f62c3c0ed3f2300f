"""A rate-limited warning, so hostile bytes cannot flood the log."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """Log at most one warning per ``interval_s``, reporting how many were suppressed."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last = -interval_s
        self._suppressed = 0

    def warning(self, message: str) -> bool:
        """Log ``message`` unless one was logged recently; True if it was logged."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._suppressed += 1
            return False
        suppressed, self._suppressed, self._last = self._suppressed, 0, now
        suffix = f" ({suppressed} similar messages suppressed)" if suppressed else ""
        self.logger.warning("%s%s", message, suffix)
        return True
