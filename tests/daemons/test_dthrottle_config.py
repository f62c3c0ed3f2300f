"""DThrottle settings: defaults of the original, TOML, flags on top, clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from smockron.daemons.dthrottle.algorithm import PrefixRule
from smockron.daemons.dthrottle.config import DThrottleConfig, Listen, parse_listen
from smockron.errors import ConfigError


def test_defaults_are_the_originals() -> None:
    c = DThrottleConfig()
    assert (c.burst, c.rate, c.report_interval) == (10, 1.0, 5.0)
    assert c.listen == (
        Listen("tcp", "127.0.0.1", 6969),
        Listen("unix", path="/tmp/dthrottle.sock"),
    )
    assert c.udp_bind is None and c.multicast is None


def test_listen_specs() -> None:
    assert parse_listen("tcp:0.0.0.0:1") == Listen("tcp", "0.0.0.0", 1)
    assert parse_listen("tcp:[::1]:7") == Listen("tcp", "::1", 7)
    assert parse_listen("unix:/a/b") == Listen("unix", path="/a/b")
    for bad in ("tcp:host", "tcp::80", "unix:", "http://x", "tcp:h:99999"):
        with pytest.raises(ConfigError, match=repr(bad).strip("'") and "HOST:PORT"):
            parse_listen(bad)


def test_file_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "d.toml"
    f.write_text(
        'burst = 5\nrate = 2\nreport_interval = 10\nwhitelist = ["10."]\n'
        'peers = ["127.0.0.1:7000"]\nmulticast = "239.1.2.3:7001"\nmax_tag_length = 64\n'
        '[[rule]]\nprefix = "api:"\nburst = 100\nrate = "10/s"\n'
    )
    c = DThrottleConfig.from_sources(f, {"burst": "7", "listen": (), "rule": [], "peers": None})
    assert c.burst == 7 and c.rate == 2.0 and c.report_interval == 10.0
    assert c.rules == (PrefixRule(b"api:", 100, 10.0),)
    assert c.whitelist == (b"10.",) and c.peers == (("127.0.0.1", 7000),)
    assert c.udp_bind == ("0.0.0.0", 6969)
    assert c.multicast == ("239.1.2.3", 7001) and c.max_tag_length == 64
    assert c.rule_table().rule_for(b"api:x").burst == 100


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"report_interval": 3601}, "report interval must be 1..3600"),
        ({"report_interval": "soon"}, "report_interval: cannot parse duration 'soon'"),
        ({"report_interval": "2h"}, "report interval must be 1..3600"),
        ({"burst": 0}, "burst must be in 1..2147483648, got 0"),
        ({"burst": "ten"}, "burst must be an integer"),
        ({"rate": "fast"}, "cannot parse rate 'fast'"),
        ({"rate": 0}, "rate must be > 0"),
        ({"peers": "a:1"}, "peers must be a list"),
        ({"peers": ["nohost"]}, "peer must be HOST:PORT"),
        ({"rule": [{"burst": 1}]}, "a \\[\\[rule\\]\\] needs prefix"),
        ({"whitelist": ["a"], "rule": [{"prefix": "a"}]}, "configured twice"),
        ({"max_tag_length": 2000}, "does not fit a datagram of 1400"),
        ({"listen": []}, "nothing to listen on"),
        ({"colour": "red"}, "unknown DThrottle setting\\(s\\): colour"),
    ],
)
def test_bad_values_are_named(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DThrottleConfig.from_mapping(raw)


def test_unreadable_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        DThrottleConfig.from_sources(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("burst = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        DThrottleConfig.from_sources(bad)
