from __future__ import annotations

import pytest

from smockron.core.rules import Rule, parse_burst, parse_rate, parse_rule_spec
from smockron.errors import RuleError


@pytest.mark.parametrize(
    ("text", "per_second"),
    [
        ("10/s", 10.0),
        ("5/m", 5 / 60),
        ("1000/h", 1000 / 3600),
        ("2/d", 2 / 86400),
        ("3/sec", 3.0),
        ("3 per sec", 3.0),
        ("100 per minute", 100 / 60),
        ("0.5/s", 0.5),
    ],
)
def test_parse_rate(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize("text", ["", "10", "10/", "/s", "10/fortnight", "-1/s", "0/s", "ten/s"])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_rate(text)
    assert repr(text) in str(info.value) or "positive" in str(info.value)


def test_parse_rule_spec() -> None:
    assert parse_rule_spec("api:10/s:20") == ("api", Rule(10.0, 20))
    assert parse_rule_spec("a:b:1000/h:5") == ("a:b", Rule(1000 / 3600, 5))


@pytest.mark.parametrize(
    "spec",
    [
        "api:10/s",
        "api:10/s:0",
        "api:10/s:x",
        ":10/s:2",
        "api:zz:3",
        # only ASCII decimal: int() alone would read these as 10, 5, 5 and 10/s
        "api:10/s:1_0",
        "api:10/s:+5",
        "api:10/s:\u0665",
        "api:\u0661\u0660/s:5",
        "api:10/s:2.5",
        "api:10/s:-3",
    ],
)
def test_parse_rule_spec_rejects(spec: str) -> None:
    with pytest.raises(RuleError):
        parse_rule_spec(spec)


def test_parse_burst_from_config_values() -> None:
    assert parse_burst(20) == 20
    assert parse_burst(" 7 ") == 7
    for bad in (True, 2.5, "1_0", "", None):
        with pytest.raises(RuleError, match="burst must be an integer"):
            parse_burst(bad)


def test_rule_windows() -> None:
    rule = Rule(2.0, 4)
    assert rule.interval_ms == 500.0
    assert rule.window_ms == 2000.0
