"""The malformed-message log cannot be flooded."""

from __future__ import annotations

import logging

import pytest

from smockron.master.ratelog import RateLimitedLog


def test_burst_then_suppressed_then_summary(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    rl = RateLimitedLog(logging.getLogger("t"), burst=3, interval=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        written = [rl.warning("bad %d", i) for i in range(100)]
        assert written.count(True) == 3
        now[0] = 10.0
        assert rl.warning("bad again")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["bad 0", "bad 1", "bad 2", "97 similar messages suppressed in the last 10s",
                        "bad again"]  # fmt: skip
