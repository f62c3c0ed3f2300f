"""A logger that cannot be flooded: hostile input must not turn into a disk-filling log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """At most ``burst`` lines per ``interval`` seconds; then one line saying how many were
    suppressed. The clock is injectable so the limit is tested exactly."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 10,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst = burst
        self.interval = interval
        self.clock = clock
        self.window_start = clock()
        self.emitted = 0
        self.suppressed = 0

    def warning(self, msg: str, *args: object) -> bool:
        """Log unless over the limit; True when the line was written."""
        now = self.clock()
        if now - self.window_start >= self.interval:
            if self.suppressed:
                self.logger.warning(
                    "%d similar messages suppressed in the last %.0fs",
                    self.suppressed,
                    now - self.window_start,
                )
            self.window_start = now
            self.emitted = 0
            self.suppressed = 0
        if self.emitted >= self.burst:
            self.suppressed += 1
            return False
        self.emitted += 1
        self.logger.warning(msg, *args)
        return True
