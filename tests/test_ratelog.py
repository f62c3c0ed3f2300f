"""The shared malformed-input log cannot be flooded, and says what it dropped."""

from __future__ import annotations

import logging

import pytest

from smockron.ratelog import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_burst_then_suppressed_then_summary(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    rl = RateLimitedLog(logging.getLogger("t"), burst=3, interval=10, clock=clock)
    with caplog.at_level(logging.WARNING):
        written = [rl.warning("bad %d", i) for i in range(100)]
        assert written.count(True) == 3
        assert rl.suppressed() == 97
        clock.now = 9.999
        assert not rl.warning("still inside the window")
        clock.now = 10.0
        assert rl.warning("bad again")
    assert messages(caplog) == [
        "bad 0",
        "bad 1",
        "bad 2",
        "bad again (98 similar messages suppressed)",
    ]
    assert rl.suppressed() == 0


def test_default_is_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    rl = RateLimitedLog(logging.getLogger("t"), interval=1.0, clock=clock)
    with caplog.at_level(logging.WARNING):
        assert rl.warning("first")
        assert not rl.warning("second")
        clock.now = 1.0
        assert rl.warning("third")
        clock.now = 2.5
        assert rl.warning("fourth")
    assert messages(caplog) == ["first", "third (1 similar messages suppressed)", "fourth"]


def test_keys_are_limited_independently(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    rl = RateLimitedLog(logging.getLogger("t"), clock=clock)
    with caplog.at_level(logging.WARNING):
        assert rl.warning("a %s", 1, key="a")
        assert rl.warning("b %s", 1, key="b")
        assert not rl.warning("a %s", 2, key="a")
        assert not rl.warning("a %s", 3, key="a")
        assert rl.suppressed("a") == 2
        assert rl.suppressed("b") == 0
        clock.now = 10.0
        assert rl.warning("a %s", 4, key="a")
    assert messages(caplog) == ["a 1", "b 1", "a 4 (2 similar messages suppressed)"]


def test_hostile_text_without_args_is_not_formatted(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    rl = RateLimitedLog(logging.getLogger("t"), clock=clock)
    with caplog.at_level(logging.WARNING):
        assert rl.warning("garbage %s %d %(x)s")
        assert not rl.warning("garbage %s %d %(x)s")
        clock.now = 10.0
        assert rl.warning("100% garbage")
    assert messages(caplog) == [
        "garbage %s %d %(x)s",
        "100% garbage (1 similar messages suppressed)",
    ]


def test_arguments_are_escaped(caplog: pytest.LogCaptureFixture) -> None:
    """Hostile bytes cannot forge a log line, drive a terminal or cut a line."""
    from smockron.ratelog import escaped

    rl = RateLimitedLog(logging.getLogger("t"), burst=10)
    with caplog.at_level(logging.WARNING):
        rl.warning("bad %s from %s (%d)", "x\n2026 INFO forged\r\x1b[2J\x00\u2028", b"\xff\n", 7)
    (line,) = messages(caplog)
    assert line == "bad x\\n2026 INFO forged\\r\\x1b[2J\\x00\\u2028 from b'\\xff\\n' (7)"
    assert escaped(ValueError("a\nb")) == "a\\nb" and escaped(None) is None
