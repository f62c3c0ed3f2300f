"""Clocks a daemon can run on: the real monotonic one, or a file a test controls.

The file clock exists so that a test can drive two real daemon processes through a
timeline exactly (the seed's DThrottle example): every reading of the time, including
the report schedule, goes through the daemon's clock, so writing "5.0" into the file is
the same for the daemon as five seconds passing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, on a scale that only moves forward."""
        ...

    async def sleep_until(self, when: float) -> None:
        """Return once ``now() >= when``."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, when: float) -> None:
        delay = when - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class FileClock:
    """Reads the time (a float in seconds) from a file; test use only.

    Write the file atomically (write a temporary file, then rename it). A file that
    cannot be read or parsed leaves the clock where it was.
    """

    POLL = 0.002

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last = 0.0
        self.now()

    def now(self) -> float:
        try:
            value = float(self.path.read_text())
        except (OSError, ValueError):
            return self._last
        if value > self._last:
            self._last = value
        return self._last

    async def sleep_until(self, when: float) -> None:
        while self.now() < when:
            await asyncio.sleep(self.POLL)


def set_file_clock(path: Path, seconds: float) -> None:
    """Move a :class:`FileClock` to ``seconds`` atomically (for tests and tools)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(repr(float(seconds)))
    tmp.replace(path)
