"""Whether a gatekeeper hears from its master: pure state, the caller passes ``now``.

A gatekeeper with a wrong master address, or without a control connection, decides
every request alone and says nothing; :class:`MasterWatch` turns that silence into a
readiness failure at once and one loud warning after a grace period, repeated at most
every ``rewarn_ms`` while it lasts.
"""

from __future__ import annotations

from dataclasses import dataclass

GRACE_MS = 5_000
"""How long after start a gatekeeper may be silent before the warning."""
STALE_MS = 10_000
"""Something heard this recently counts, even without a connection right now."""
REWARN_MS = 60_000
"""The warning is repeated at most this often while the master stays silent."""


@dataclass(slots=True)
class MasterWatch:
    """The last time a master was heard from (a control message, a rules offer, or the
    control connection coming up), and the warning schedule."""

    control: str | None
    started_ms: int
    grace_ms: int = GRACE_MS
    stale_ms: int = STALE_MS
    rewarn_ms: int = REWARN_MS
    last_heard_ms: int | None = None
    warned_ms: int | None = None

    def heard(self, now_ms: int) -> None:
        self.last_heard_ms = now_ms

    def problem(self, now_ms: int, connected: bool) -> str | None:
        """Why the master does not count as heard from, or None (also with no master)."""
        if not self.control or connected:
            return None
        last = self.last_heard_ms
        if last is not None and now_ms - last <= self.stale_ms:
            return None
        if last is None:
            heard = f"nothing heard in the {(now_ms - self.started_ms) / 1000:.0f} s since start"
        else:
            heard = f"nothing heard for {(now_ms - last) / 1000:.0f} s"
        return f"no control connection to the master at {self.control}: {heard}"

    def warning(self, now_ms: int, connected: bool) -> str | None:
        """The warning to log now, if one is due (after the grace, then rate-limited)."""
        problem = self.problem(now_ms, connected)
        if problem is None:
            self.warned_ms = None  # the next outage warns again at once
            return None
        if now_ms - self.started_ms < self.grace_ms:
            return None
        if self.warned_ms is not None and now_ms - self.warned_ms < self.rewarn_ms:
            return None
        self.warned_ms = now_ms
        return (
            f"{problem}: requests are decided without the master's verdicts "
            "(check the gatekeeper's --control/--accounting addresses and that the "
            "master runs)"
        )
