"""Readiness: named checks, each saying what is wrong or ``None`` when it passes.

Checks run in the listener's thread at probe time, so each must be quick and only read
state the daemon keeps up to date itself (a flag, a timestamp, a count); anything that
needs I/O (a Redis ping) is done by the daemon's own loop, which records the outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

Check = Callable[[], str | None]
"""Returns ``None`` when ready, else a short reason for the probe's JSON body."""


class Readiness:
    """The checks of one process; ready when all pass."""

    def __init__(self, checks: Mapping[str, Check] | None = None) -> None:
        self._checks: dict[str, Check] = dict(checks or {})

    def add(self, name: str, check: Check) -> None:
        self._checks[name] = check

    @property
    def names(self) -> list[str]:
        return sorted(self._checks)

    def failing(self) -> dict[str, str]:
        """The failing checks and why; a check that raises fails (and says so)."""
        out: dict[str, str] = {}
        for name, check in sorted(self._checks.items()):
            try:
                reason = check()
            except Exception as exc:  # a probe must answer, whatever a check does
                reason = f"check raised {type(exc).__name__}: {exc}"
            if reason is not None:
                out[name] = reason
        return out


def bound(is_bound: Callable[[], bool], what: str = "sockets") -> Check:
    """A check passing once ``is_bound()`` is true."""

    def check() -> str | None:
        return None if is_bound() else f"{what} not bound yet"

    return check
