"""Settings from TOML, the original master's YAML, and flags, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from smockron.core.rules import Rule
from smockron.errors import ConfigError
from smockron.master.config import MasterSettings, limits, load_settings
from smockron.master.domains import DomainPolicy
from smockron.master.original_config import rate_for_interval
from smockron.wire.codec import Limits

TOML = """
accounting = "tcp://127.0.0.1:7000"
control = "tcp://127.0.0.1:7001"
store = "redis://127.0.0.1:7379/2"
metrics = "127.0.0.1:9100"
stats_interval = 5
skew_tolerance = 0.5
hwm = 1000
queue = 5000
batch = 100
max_domain = 64
max_identifier = 128
max_loginfo = 512
rules = ["api:10/s:20", "api:1000/h:1000"]
algorithms = { api = "gcra" }

[domains.login]
rate = "5/m"
burst = 5
rules = [{ rate = "100/d", burst = 100 }, "1/s:1"]
"""


def test_toml_says_all_the_flags_say(tmp_path: Path) -> None:
    path = tmp_path / "smockron.toml"
    path.write_text(TOML)
    s = load_settings(path)
    assert (s.accounting, s.control, s.store) == (
        "tcp://127.0.0.1:7000",
        "tcp://127.0.0.1:7001",
        "redis://127.0.0.1:7379/2",
    )
    assert (s.metrics, s.stats_interval, s.skew_tolerance, s.hwm) == (
        "127.0.0.1:9100",
        5,
        0.5,
        1000,
    )
    assert (s.queue, s.batch, s.max_domain, s.max_identifier, s.max_loginfo) == (
        5000,
        100,
        64,
        128,
        512,
    )
    assert limits(s) == Limits(max_domain=64, max_identifier=128, max_loginfo=512)
    assert s.domains["api"] == DomainPolicy((Rule(10.0, 20), Rule(1000 / 3600, 1000)), "gcra")
    assert s.domains["login"] == DomainPolicy(
        (Rule(5 / 60, 5), Rule(100 / 86400, 100), Rule(1.0, 1)), "history"
    )


def test_flags_override_file(tmp_path: Path) -> None:
    path = tmp_path / "smockron.toml"
    path.write_text(TOML)
    s = load_settings(
        path,
        overrides={"store": "memory://", "hwm": None},
        rules=["api:1/s:1", "new:2/m:3"],
        algorithms=["new=gcra"],
    )
    assert s.store == "memory://" and s.hwm == 1000
    assert s.domains["api"] == DomainPolicy((Rule(1.0, 1),), "gcra")  # algorithm kept
    assert s.domains["new"] == DomainPolicy((Rule(2 / 60, 3),), "gcra")
    assert "login" in s.domains


def test_original_yaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "server:\n  listen: 'tcp://*:5555'\n"
        "datastore:\n  redis:\n    host: 10.0.0.1\n    port: 6380\n"
        "domains:\n  api:\n    rate: 3/sec\n    burst: 5\n"
        "  web:\n    rate: '100 per minute'\n    burst: 10\n"
    )
    s = load_settings(path)
    assert (s.accounting, s.control) == ("tcp://*:5555", "tcp://*:5556")
    assert s.store == "redis://10.0.0.1:6380/0"
    # as the original computes them: Math.round(1000 / 3) = 333 ms and 600 ms between
    # requests; GCRA, its algorithm (tests/master/test_original_config.py has the rest)
    assert s.domains == {
        "api": DomainPolicy((Rule(rate_for_interval(333), 5),), "gcra"),
        "web": DomainPolicy((Rule(rate_for_interval(600), 10),), "gcra"),
    }


@pytest.mark.parametrize(
    ("listen", "acc", "ctl"),
    [
        (10004, "tcp://*:10004", "tcp://*:10005"),
        ("127.0.0.1:9", "tcp://127.0.0.1:9", "tcp://127.0.0.1:10"),
    ],
)
def test_yaml_listen_forms(tmp_path: Path, listen: object, acc: str, ctl: str) -> None:
    path = tmp_path / "c.yml"
    path.write_text(f"server:\n  listen: {listen!r}\ndatastore: memory\n")
    s = load_settings(path)
    assert (s.accounting, s.control, s.store) == (acc, ctl, "memory://")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.toml", "rules = [", "cannot parse"),
        ("a.toml", "colour = 1", "unknown settings"),
        ("a.toml", 'rules = ["api:10/x:1"]', "unknown time unit"),
        ("a.toml", "[domains.api]\nrate = '1/s'", "needs both rate and burst"),
        ("a.toml", "[domains.api]\nrate = '1/s'\nburst = 0", "burst must be"),
        ("a.toml", "hwm = -1", "hwm must be"),
        ("a.toml", "max_identifier = 0", "max_identifier must be"),
        ("a.toml", "algorithms = { api = 'gcra' }", "no rules"),
        ("a.toml", "[domains.api]\nrules = ['1/s:1']\nalgorithm = 'leaky'", "unknown algorithm"),
        ("a.yaml", "- 1", "mapping at the top level"),
        ("a.yaml", "datastore: {mongo: 1}", "datastore"),
    ],
)
def test_errors_name_the_problem(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(path)


def test_missing_file_and_bad_flag() -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings("/nonexistent/smockron.toml")
    with pytest.raises(ConfigError, match="DOMAIN=gcra"):
        load_settings(rules=["api:1/s:1"], algorithms=["gcra"])
    assert load_settings() == MasterSettings()
