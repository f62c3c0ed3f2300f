"""The original Smockron master's YAML: every spelling it accepts loads and means the same.

"Means the same" is checked against the original's code (lib/smockron/master/index.js,
server.js, datastore.js and then-redis's client), restated here where a test needs it.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest

from smockron.errors import ConfigError
from smockron.master.config import load_settings
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.original_config import rate_for_interval
from smockron.master.stores import MemoryStore
from smockron.wire.codec import ACCEPTED, DELAYED, decode_control, encode_accounting

# The original's config/default.yaml, verbatim.
ORIGINAL_DEFAULT_YAML = """\
server:
  listen: "0.0.0.0"
datastore:
  host: localhost
domains:
  default:
    rate: "1/sec"
    burst: 10
stats:
  host: localhost
"""


def load_yaml(tmp_path: Path, text: str, name: str = "master.yaml") -> Any:
    path = tmp_path / name
    path.write_text(text)
    return load_settings(path)


# Whole files: (YAML, accounting, control, store, {domain: (interval ms, burst, algorithm)})
FILES = [
    pytest.param(
        ORIGINAL_DEFAULT_YAML,
        "tcp://0.0.0.0:10004",
        "tcp://0.0.0.0:10005",
        "redis://127.0.0.1:6379/0",  # then-redis reads "localhost" so
        {"default": (1000, 10, "gcra")},
        id="the-originals-default.yaml",
    ),
    pytest.param(
        "server:\n  listen: 'tcp://10.0.0.5:7000'\n"
        "datastore:\n  host: 'tcp://1:pw@redis.internal:6380'\n"
        "domains:\n"
        "  api:\n    rate: '3 per sec'\n    burst: '10'\n"
        "  login:\n    rate: '5/10min'\n    burst: '20min'\n"
        "  img:\n    interval: 50\n    burst: '1s'\n"
        "stats:\n  host: statsd.internal\n",
        "tcp://10.0.0.5:7000",
        "tcp://10.0.0.5:7001",
        "redis://:pw@redis.internal:6380/1",
        {"api": (333, 10, "gcra"), "login": (120_000, 10, "gcra"), "img": (50, 20, "gcra")},
        id="a-deployment",
    ),
    pytest.param(
        "server:\n  listen: '*'\n"
        "datastore: 'redis://127.0.0.1:6379/0?layout=original'\n"
        "domains:\n  api:\n    rate: '1/2s'\n    burst: '4s'\n",
        "tcp://*:10004",
        "tcp://*:10005",
        "redis://127.0.0.1:6379/0?layout=original",
        {"api": (2000, 2, "gcra")},
        id="migration",
    ),
]


@pytest.mark.parametrize(("text", "accounting", "control", "store", "domains"), FILES)
def test_whole_files(
    tmp_path: Path,
    text: str,
    accounting: str,
    control: str,
    store: str,
    domains: dict[str, tuple[int, int, str]],
) -> None:
    s = load_yaml(tmp_path, text)
    assert (s.accounting, s.control, s.store) == (accounting, control, store)
    got = {
        name: (round(p.rules[0].interval_ms), p.rules[0].burst, p.algorithm)
        for name, p in s.domains.items()
    }
    assert got == domains


@pytest.mark.parametrize(
    ("listen", "accounting", "control"),
    [
        ('"0.0.0.0"', "tcp://0.0.0.0:10004", "tcp://0.0.0.0:10005"),  # no port: 10004
        ('"*"', "tcp://*:10004", "tcp://*:10005"),
        ('"127.0.0.1:7000"', "tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001"),
        ('"tcp://*:5555"', "tcp://*:5555", "tcp://*:5556"),
        ('"tcp://10.1.2.3"', "tcp://10.1.2.3:10004", "tcp://10.1.2.3:10005"),
        ('"[::1]:7000"', "tcp://[::1]:7000", "tcp://[::1]:7001"),
        ("7000", "tcp://*:7000", "tcp://*:7001"),  # smockron's: a port alone
        ('"7000"', "tcp://*:7000", "tcp://*:7001"),
    ],
)
def test_listen(tmp_path: Path, listen: str, accounting: str, control: str) -> None:
    s = load_yaml(tmp_path, f"server:\n  listen: {listen}\n")
    assert (s.accounting, s.control) == (accounting, control)


@pytest.mark.parametrize(
    ("datastore", "store"),
    [
        ("{host: localhost}", "redis://127.0.0.1:6379/0"),
        ("{host: '127.0.0.1'}", "redis://127.0.0.1:6379/0"),
        ("{}", "redis://127.0.0.1:6379/0"),  # then-redis's default
        ("{host: 'tcp://redis1:6380'}", "redis://redis1:6380/0"),
        ("{host: 'tcp://Redis1'}", "redis://redis1:6379/0"),
        ("{host: 'redis://redis1:6380'}", "redis://redis1:6380/0"),  # any scheme will do
        ("{host: 'tcp://2:s3cret@redis1:6380'}", "redis://:s3cret@redis1:6380/2"),  # db:password
        ("{host: 'tcp://[::1]:6380'}", "redis://[::1]:6380/0"),
        ("{host: {host: redis1, port: 6381, database: 3}}", "redis://redis1:6381/3"),
        # smockron's own spellings
        ("'redis://redis1:6380/1?layout=original'", "redis://redis1:6380/1?layout=original"),
        ("memory", "memory://"),
        ("{redis: {host: redis1, port: 6380}}", "redis://redis1:6380/0"),
        ("{host: redis1, port: 6380, db: 2}", "redis://redis1:6380/2"),
    ],
)
def test_datastore(tmp_path: Path, datastore: str, store: str) -> None:
    assert load_yaml(tmp_path, f"datastore: {datastore}\n").store == store


def test_no_datastore_is_memory(tmp_path: Path) -> None:
    assert load_yaml(tmp_path, "server: {listen: '*'}\n").store == "memory://"


# (rate or interval, burst) -> (ms between requests, burst in requests), as the original's
# parseRate (Math.round(period / count)), parseInterval and configureDomains compute them.
RULES = [
    ("rate: '1/sec'", "10", 1000, 10),
    ("rate: '3/sec'", "5", 333, 5),  # Math.round(1000 / 3)
    ("rate: '3 per sec'", "5", 333, 5),
    ("rate: '3persec'", "5", 333, 5),
    ("rate: '2/sec'", "'4'", 500, 4),  # a burst count as text
    ("rate: '1/2s'", "3", 2000, 3),
    ("rate: '5/10min'", "2", 120_000, 2),
    ("rate: '100 per minute'", "10", 600, 10),
    ("rate: '7/minutes'", "1", 8571, 1),  # 8571.43 rounds down
    ("rate: '2/3'", "4", 2, 4),  # a bare period is ms: 1.5 rounds up, as Math.round does
    ("rate: '1/500ms'", "'2s'", 500, 4),  # burst as a duration: 2000 ms of tolerance
    ("rate: '1/msec'", "'10ms'", 1, 10),
    ("rate: '1/h'", "'1 day'", 3_600_000, 24),
    ("rate: '1/sec'", "'s'", 1000, 1),  # a unit alone is one of it
    ("interval: '250ms'", "'1s'", 250, 4),  # interval instead of rate
    ("interval: 125", "8", 125, 8),  # a number is ms
    ("interval: '2s'", "'10'", 2000, 10),
    ("rate: ''\n    interval: '100'", "3", 100, 3),  # an empty rate falls to interval
    ("rate: '10/s'", "2.5", 100, 2),  # 250 ms of tolerance: 2.5 requests, 2 kept (warned)
]


@pytest.mark.parametrize(("rate", "burst", "interval", "count"), RULES)
def test_rates(tmp_path: Path, rate: str, burst: str, interval: int, count: int) -> None:
    s = load_yaml(tmp_path, f"domains:\n  api:\n    {rate}\n    burst: {burst}\n")
    policy = s.domains["api"]
    (rule,) = policy.rules
    assert policy.algorithm == "gcra"
    assert abs(rule.interval_ms - interval) <= interval * 2**-52
    assert rule.burst == count


def test_whole_ms_intervals_are_exact() -> None:
    exact = sum(1000.0 / rate_for_interval(i) == i for i in range(1, 20_001))
    assert exact > 17_000  # most; the others are one ulp off (see the next test)


def test_a_duration_burst_between_requests_keeps_the_whole_requests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "smockron.master.config"):
        s = load_yaml(tmp_path, "domains:\n  api:\n    rate: '3/sec'\n    burst: '2s'\n")
    assert s.domains["api"].rules[0].burst == 6  # 2000 ms is 6.006 intervals of 333 ms
    assert "burst '2s' is 2000 ms, 6.006 intervals of 333 ms" in caplog.text
    assert "master.yaml" in caplog.text and "'api'" in caplog.text


def test_settings_not_read_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The original's ``stats`` (statsd) and keys neither master reads load, each named in
    one warning, not dropped silently."""
    text = ORIGINAL_DEFAULT_YAML + "statsd:\n  port: 8125\nserver_name: edge\n"
    text = text.replace('  listen: "0.0.0.0"\n', '  listen: "0.0.0.0"\n  backlog: 5\n')
    with caplog.at_level(logging.WARNING, "smockron.master.config"):
        settings = load_yaml(tmp_path, text)
    assert settings.accounting == "tcp://0.0.0.0:10004"
    assert "'stats' (the original master's statsd) is not read" in caplog.text
    assert (
        "not read by the original master nor by smockron: server_name, statsd, server.backlog"
        in caplog.text
    )
    caplog.clear()
    plain = "server:\n  listen: '*'\ndomains:\n  a: {rate: 1/sec, burst: 2}\n"
    with caplog.at_level(logging.WARNING, "smockron.master.config"):
        load_yaml(tmp_path, plain)
    assert caplog.text == ""


def test_redis_url_is_named_when_the_file_has_no_datastore(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The original's Redis client reads REDIS_URL when the file names no host; smockron
    does not, and says so rather than keep the state in memory without a word."""
    monkeypatch.setenv("REDIS_URL", "redis://redis.internal:6379")
    plain = "server:\n  listen: '*'\ndomains:\n  a: {rate: 1/sec, burst: 2}\n"
    with caplog.at_level(logging.WARNING, "smockron.master.config"):
        assert load_yaml(tmp_path, plain).store == "memory://"
    assert "REDIS_URL is not read" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "smockron.master.config"):
        load_yaml(tmp_path, plain + "datastore:\n  host: 'tcp://redis.internal:6379'\n")
    assert caplog.text == ""


def test_algorithm_and_smockron_rules_still_accepted(tmp_path: Path) -> None:
    s = load_yaml(
        tmp_path,
        "domains:\n  api:\n    rate: '3/sec'\n    burst: 5\n    algorithm: history\n"
        "  web:\n    rules: ['10/s:20']\n",
    )
    assert s.domains["api"].algorithm == "history"
    assert s.domains["web"].algorithm == "gcra"  # a domain of this file runs GCRA


def _original_update(
    prev: float | None, ts: float, now: float, interval: float, burst: float
) -> float:
    """The original datastore.js Lua script's new value (Math.max(ts, now) as its now)."""
    t = max(ts, now)
    if prev is not None and prev >= t - burst:
        return prev + interval
    return t - burst + interval


@pytest.mark.parametrize(
    ("rate", "burst", "interval_ms", "burst_ms"),
    [
        ("3/sec", 5, 333, 1665),
        ("1/2s", 3, 2000, 6000),
        ("7/minutes", 2, 8571, 17142),
        ("100 per minute", 10, 600, 6000),
        ("2/3", 4, 2, 8),
        ("1/sec", 1, 1000, 1000),
    ],
)
def test_same_delays_as_the_original(
    tmp_path: Path, rate: str, burst: int, interval_ms: int, burst_ms: int
) -> None:
    """Random traffic through the engine with the rule this file gives, against the
    original's formula with its own interval and burst in ms: every DELAY_UNTIL the same,
    to the millisecond. A client sends at random, at times after a rest; its gatekeeper
    holds a throttled request until the DELAY_UNTIL and reports it DELAYED, as the
    original's do. (Rests are long enough for both masters to forget the client: the
    original's key expires one burst after the last request, which may be before its
    value stops mattering; smockron's ``memory://`` keeps it until then. The Redis store
    with ``?layout=original`` expires it as the original does.)"""
    s = load_yaml(tmp_path, f"domains:\n  api:\n    rate: '{rate}'\n    burst: {burst}\n")
    engine = Engine(s.domains, MemoryStore())
    rng = random.Random(rate)
    value, expiry = None, 0.0  # the original's key
    now = 1_763_000_000_000.0
    published = 0
    for _ in range(3000):
        gap = rng.choice((0, 0, 0, 0, 1, interval_ms // 3, interval_ms, -1))
        now = now + gap if gap >= 0 else max(now, value or now) + burst_ms + rng.randrange(99)
        prev = value if expiry >= now else None  # Redis expires a key after its PEXPIREAT
        if prev is not None and prev > now:  # held until its DELAY_UNTIL
            ts = prev
            frames = encode_accounting("api", DELAYED, b"client", int(now), int(ts))
        else:
            ts = now - rng.choice((0, 1, 20))
            frames = encode_accounting("api", ACCEPTED, b"client", int(ts))
        out = engine.process([frames], now)
        value = _original_update(prev, ts, now, interval_ms, burst_ms)
        expiry = max(ts, now) + burst_ms
        expected = [int(value)] if value > now else []
        assert [decode_control(c).until_ms for c in out] == expected
        published += len(out)
    assert published > 200


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "domains:\n  api:\n    rate: '3/fortnight'\n    burst: 5\n",
            ["'api'", "'3/fortnight'", "fortnight"],
        ),
        ("domains:\n  api:\n    rate: 5\n    burst: 5\n", ["'api'", "rate 5", "'3/sec'"]),
        ("domains:\n  api:\n    rate: '3/sec'\n", ["'api'", "needs a burst"]),
        ("domains:\n  api:\n    burst: 5\n", ["'api'", "needs a rate"]),
        ("domains:\n  api:\n    rate: '3/sec'\n    burst: '2x'\n", ["'api'", "burst '2x'"]),
        ("domains:\n  api:\n    rate: '3/sec'\n    burst: true\n", ["'api'", "burst True"]),
        ("domains:\n  api:\n    rate: '0/sec'\n    burst: 1\n", ["'api'", "'0/sec'"]),
        (
            "domains:\n  api:\n    rate: '3000/sec'\n    burst: 1\n",
            ["'api'", "'3000/sec'", "every 0 ms", "limits nothing"],
        ),
        (
            "domains:\n  api:\n    rate: '3/sec'\n    burst: '100ms'\n",
            ["'api'", "'100ms'", "less than one interval of 333 ms"],
        ),
        ("domains:\n  api:\n    interval: '5 weeks'\n    burst: 1\n", ["'api'", "'5 weeks'"]),
        (
            "domains:\n  api:\n    rate: 1/s\n    burst: 1\n    algorithm: leaky\n",
            ["'api'", "unknown algorithm 'leaky'"],
        ),
        ("domains:\n  api:\n    rules: ['1/x:1']\n", ["'api'", "unknown time unit 'x'"]),
        ("server:\n  listen: ':10004'\n", ["server.listen ':10004'", "names no host"]),
        ("server:\n  listen: 'h:65535'\n", ["server.listen 'h:65535'", "out of range"]),
        ("datastore:\n  host: redis1\n", ["datastore", "'redis1'", "tcp://redis1:6379"]),
        ("datastore:\n  host: 'redis1:6380'\n", ["'redis1:6380'", "'tcp://redis1:6380'"]),
        ("datastore:\n  host: 'tcp://redis1:x'\n", ["'tcp://redis1:x'", "not a number"]),
        ("datastore:\n  host: 'tcp://redis1'\n  port: 6380\n", ["'tcp://redis1'", "port"]),
        ("datastore: 'tcp://redis1:6380'\n", ["'tcp://redis1:6380'", "datastore.host"]),
        (
            "datastore: 'redis://tcp://redis1:6380/0'\n",
            ["'redis://tcp://redis1:6380/0'", "URI inside a URI"],
        ),
        ("datastore: 'redis://redis1/0?layout=old'\n", ["'redis://redis1/0?layout=old'", "'old'"]),
        (
            "datastore: 'redis://r/0?layout=original'\ndomains:\n  api:\n    rate: 1/s\n"
            "    burst: 1\n    algorithm: history\n",
            ["'api'", "'history'", "original"],
        ),
        ("socket:\n  listen: '0.0.0.0'\n", ["socket", "server.listen"]),
    ],
)
def test_errors_name_file_domain_and_value(tmp_path: Path, text: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_yaml(tmp_path, text, "prod.yaml")
    message = str(info.value)
    for word in words:
        assert word in message, message
    assert "prod.yaml" in message, message


def test_layout_option_checked_for_flags_too() -> None:
    with pytest.raises(ConfigError, match="domain 'api' has 2 rule"):
        load_settings(
            overrides={"store": "redis://127.0.0.1:6379/0?layout=original"},
            rules=["api:1/s:1", "api:10/m:5"],
            algorithms=["api=gcra"],
        )
    settings = load_settings(
        overrides={"store": "redis://127.0.0.1:6379/0?layout=original"},
        rules=["api:1/s:1"],
        algorithms=["api=gcra"],
    )
    assert settings.domains["api"] == DomainPolicy(settings.domains["api"].rules, "gcra")


def test_rates_the_original_cannot_parse_are_read_as_rule_flags(tmp_path: Path) -> None:
    s = load_yaml(
        tmp_path,
        "domains:\n  a:\n    rate: '1.5/s'\n    burst: 3\n"
        "  b:\n    rate: '10/secs'\n    burst: 1\n",
    )
    assert s.domains["a"].rules[0].rate == pytest.approx(1.5)  # unrounded: 666.67 ms
    assert s.domains["a"].rules[0].burst == 3
    assert s.domains["b"].rules[0].interval_ms == 100.0


def test_math_round() -> None:
    from smockron.core.rules import js_round, original_interval_ms, original_rate_interval_ms

    assert [js_round(x) for x in (2.5, 3.5, -2.5, 0.49999999999999994, 8571.428)] == [
        3.0,
        4.0,
        -2.0,
        0.0,
        8571.0,
    ]
    assert original_rate_interval_ms("1/3s") == 3000.0
    assert original_rate_interval_ms("2 per 3") == 2.0  # 1.5 ms rounds up
    assert original_rate_interval_ms("3/Sec") is None  # its units are lower case
    assert original_interval_ms("") == 1.0  # no count, no unit: 1 ms, as the original
    assert original_interval_ms(1.5) == 1.5  # a number is taken as it is
