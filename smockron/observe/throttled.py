"""Which identifiers a master throttles most: bounded counts of its DELAY_UNTILs.

Fed with the control messages the master publishes (``[domain\\0, DELAY_UNTIL,
identifier, until]``), read by the stats endpoint and ``smockron top``. Bounded twice,
as identifiers come from the network: at most ``capacity`` identifiers are counted per
window (later new ones only add to ``others``), and the counts restart every
``window_s`` so the view follows what happens now.
"""

from __future__ import annotations

from collections.abc import Iterable

from smockron.ratelog import escape_controls

CAPACITY = 10_000
WINDOW_S = 60.0
TOP = 10


def escape_identifier(raw: bytes, limit: int = 80) -> str:
    """An identifier as inert text: undecodable bytes and control characters escaped,
    cut to ``limit`` characters."""
    text = raw[: limit * 4].decode("utf-8", "backslashreplace")
    text = escape_controls(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class TopThrottled:
    """Per (domain frame, identifier) counts of DELAY_UNTILs in the current window."""

    def __init__(self, capacity: int = CAPACITY, window_s: float = WINDOW_S) -> None:
        self.capacity = capacity
        self.window_s = window_s
        self.counts: dict[tuple[bytes, bytes], int] = {}
        self.others = 0
        self.window_start = 0.0

    def add(self, controls: Iterable[list[bytes]], now_s: float) -> None:
        if now_s - self.window_start >= self.window_s:
            self.counts = {}
            self.others = 0
            self.window_start = now_s
        counts = self.counts
        for frames in controls:
            key = (frames[0], frames[2])
            n = counts.get(key)
            if n is not None:
                counts[key] = n + 1
            elif len(counts) < self.capacity:
                counts[key] = 1
            else:
                self.others += 1

    def top(self, n: int = TOP) -> dict[str, list[tuple[str, int]]]:
        """The ``n`` most throttled identifiers of each domain, escaped, most first.
        (Safe from another thread: the dict is copied in one step under the GIL.)"""
        counts = self.counts.copy()
        by_domain: dict[str, list[tuple[str, int]]] = {}
        for (frame, ident), count in sorted(counts.items(), key=lambda kv: -kv[1]):
            domain = escape_identifier(frame.rstrip(b"\0"))
            rows = by_domain.setdefault(domain, [])
            if len(rows) < n:
                rows.append((escape_identifier(ident), count))
        return by_domain
