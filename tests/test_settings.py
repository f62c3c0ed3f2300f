"""The one settings layer: parsers, precedence over all six commands, one-line usage errors."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from smockron.cli import main
from smockron.errors import ConfigError
from smockron.settings import check_zmq_address, env_name, parse_duration, parse_host_port


@pytest.fixture(autouse=True)
def _root_logging() -> Iterator[None]:
    """Commands configure the root logger; give the next test the one it had."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


# ---------------------------------------------------------------------------- parsers


@pytest.mark.parametrize(
    ("text", "bare", "seconds"),
    [
        ("500ms", "s", 0.5),
        ("2s", "s", 2.0),
        ("1.5m", "s", 90.0),
        ("1m30s", "s", 90.0),
        ("2h", "s", 7200.0),
        ("1d", "s", 86400.0),
        ("250us", "s", 0.00025),
        ("5", "s", 5.0),
        ("0", None, 0.0),
        ("100", "ms", 0.1),
    ],
)
def test_durations(text: str, bare: str | None, seconds: float) -> None:
    assert parse_duration(text, bare=bare) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "bare", "message"),
    [
        ("2", None, "has no unit: write e.g. 2ms or 2s"),
        ("2x", "s", "cannot parse duration '2x'"),
        ("", "s", "cannot parse duration ''"),
        ("-1s", "s", "cannot parse duration '-1s'"),
        ("1s2", "s", "cannot parse duration '1s2'"),
    ],
)
def test_bad_durations(text: str, bare: str | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_duration(text, bare=bare)


@pytest.mark.parametrize(
    ("text", "listen", "parsed"),
    [
        ("127.0.0.1:80", False, ("127.0.0.1", 80)),
        ("[::1]:8080", False, ("::1", 8080)),
        ("example.org:65535", False, ("example.org", 65535)),
        ("*:1050", True, ("*", 1050)),
        (":1051", True, ("", 1051)),
        ("127.0.0.1:0", True, ("127.0.0.1", 0)),
    ],
)
def test_host_port(text: str, listen: bool, parsed: tuple[str, int]) -> None:
    assert parse_host_port(text, listen=listen) == parsed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("::1:80", "brackets"),
        ("host", "expected HOST:PORT"),
        ("host:http", "expected HOST:PORT"),
        ("host:65536", "not in 1..65535"),
        ("host:0", "not in 1..65535"),
        (":80", "names no host"),
    ],
)
def test_bad_host_port(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_host_port(text)


def test_zmq_addresses_keep_their_form() -> None:
    for good in ("tcp://*:10004", "tcp://127.0.0.1:*", "tcp://[::1]:5", "ipc:///tmp/s"):
        assert check_zmq_address(good) == good
    for bad in ("garbage", "tcp://host", "tcp://h:70000", "udp://h:1"):
        with pytest.raises(ConfigError, match=repr(bad)):
            check_zmq_address(bad)


def test_env_names() -> None:
    assert env_name("cluster", "--batch-timeout") == "SMOCKRON_CLUSTER_BATCH_TIMEOUT"
    assert env_name("proxy", "max-delayed") == "SMOCKRON_PROXY_MAX_DELAYED"


# ---------------------------------------------------------------------------- precedence


@dataclass(frozen=True)
class Row:
    """One command's setting, given at each level: flag, environment, file, or none."""

    command: str
    flag: list[str]
    env: tuple[str, str]
    file: str  # a line of the command's TOML file
    key: str  # in --print-settings
    values: tuple[object, object, object, object | None]  # flag, env, file, default
    base: list[str] = field(default_factory=list)


ROWS = [
    Row(
        "master",
        ["--stats-interval", "3s"],
        ("SMOCKRON_MASTER_STATS_INTERVAL", "4"),
        "stats_interval = 5",
        "stats_interval",
        (3.0, 4.0, 5.0, 60.0),
    ),
    Row(
        "router",
        ["--hwm", "11"],
        ("SMOCKRON_ROUTER_HWM", "12"),
        "hwm = 13",
        "hwm",
        (11, 12, 13, 100_000),
        ["--master", "tcp://127.0.0.1:1,tcp://127.0.0.1:2"],
    ),
    Row(
        "proxy",
        ["--max-delay", "1s"],
        ("SMOCKRON_PROXY_MAX_DELAY", "2"),
        'max-delay = "3s"',
        "max_delay",
        (1000.0, 2000.0, 3000.0, 5000.0),
        ["--listen", "127.0.0.1:1", "--upstream", "http://127.0.0.1:2", "--domain", "api"],
    ),
    Row(
        "cluster",
        ["--batch-timeout", "11ms"],
        ("SMOCKRON_CLUSTER_BATCH_TIMEOUT", "12ms"),
        'batch_timeout = "13ms"',
        "batch_timeout_ms",
        (11.0, 12.0, 13.0, 500.0),
    ),
    Row(
        "jarl",
        ["--period", "11"],
        ("SMOCKRON_JARL_PERIOD", "12"),
        "period = 13",
        "period",
        (11, 12, 13, None),  # --period is required: no default
        ["--service", "s", "--requests", "1", "--ip", "127.0.0.1", "--port", "1"],
    ),
    Row(
        "dthrottle",
        ["--burst", "11"],
        ("SMOCKRON_DTHROTTLE_BURST", "12"),
        "burst = 13",
        "burst",
        (11, 12, 13, 10),
    ),
]
LEVELS = ["flag", "env", "file", "default"]


def _run(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, args, env=env or {}, catch_exceptions=False)


def _settings(row: Row, level: str, tmp_path: Path) -> Result:
    """``--print-settings`` with the setting given at ``level`` and every level below it."""
    config = tmp_path / f"{row.command}.toml"
    config.write_text(row.file + "\n")
    depth = LEVELS.index(level)
    args = [row.command, *row.base, "--print-settings"]
    if depth <= 2:
        args += ["--config", str(config)]
    if depth == 0:
        args += row.flag
    env = dict([row.env]) if depth <= 1 else {}
    return _run(args, env)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("row", ROWS, ids=[r.command for r in ROWS])
def test_flag_beats_env_beats_file_beats_default(row: Row, level: str, tmp_path: Path) -> None:
    expected = row.values[LEVELS.index(level)]
    if expected is None:
        pytest.skip(f"{row.command}'s setting is required: it has no default")
    result = _settings(row, level, tmp_path)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[row.key] == expected


def test_cluster_smockron_env_beats_guber_env_beats_file(tmp_path: Path) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text("cache-size = 7\n")
    both = {"GUBER_CACHE_SIZE": "8", "SMOCKRON_CLUSTER_CACHE_SIZE": "9"}
    for env, expected in (({}, 7), ({"GUBER_CACHE_SIZE": "8"}, 8), (both, 9)):
        result = _run(["cluster", "--config", str(config), "--print-settings"], env)
        assert json.loads(result.stdout)["cache_size"] == expected, env


def test_dthrottle_keeps_its_plural_variables() -> None:
    env = {"SMOCKRON_DTHROTTLE_PEERS": "127.0.0.1:7001 127.0.0.1:7002"}
    result = _run(["dthrottle", "--print-settings"], env)
    assert json.loads(result.stdout)["peers"] == [["127.0.0.1", 7001], ["127.0.0.1", 7002]]


def test_config_file_keys_take_dashes_or_underscores(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text(
        'listen = "127.0.0.1:1"\nupstream = "http://a"\ndomain = "d"\n'
        "max_delayed = 5\nreject-sample = 0.5\n"
    )
    result = _run(["proxy", "--config", str(config), "--print-settings"])
    printed = json.loads(result.stdout)
    assert (printed["max_delayed"], printed["reject_sample"]) == (5, 0.5)


# ---------------------------------------------------------------------------- bad values


BAD = [
    # command, base args, bad flag, bad env var, bad file line, what each error names
    ("master", [], ["--stats-interval", "soon"], ("SMOCKRON_MASTER_HWM", "0"), "hwm = 0"),
    (
        "router",
        ["--master", "tcp://127.0.0.1:1,tcp://127.0.0.1:2"],
        ["--accounting", "x"],
        ("SMOCKRON_ROUTER_HWM", "many"),
        'control = "nowhere"',
    ),
    (
        "proxy",
        ["--upstream", "http://a", "--domain", "d"],
        ["--listen", "1.2.3.4:70000"],
        ("SMOCKRON_PROXY_LISTEN", "nohost"),
        'listen = "::1:80"',
    ),
    (
        "cluster",
        [],
        ["--batch-timeout", "2"],
        ("SMOCKRON_CLUSTER_CACHE_SIZE", "big"),
        'global_timeout = "5"',
    ),
    (
        "jarl",
        ["--service", "s", "--requests", "1", "--ip", "127.0.0.1", "--port", "1"],
        ["--period", "0"],
        ("SMOCKRON_JARL_PERIOD", "soon"),
        'period = "x"',
    ),
    ("dthrottle", [], ["--stats-interval", "-1"], ("SMOCKRON_DTHROTTLE_BURST", "0"), "burst = 0"),
]


@pytest.mark.parametrize("where", ["flag", "env", "file"])
@pytest.mark.parametrize(("command", "base", "flag", "env", "line"), BAD, ids=[b[0] for b in BAD])
def test_bad_values_exit_2_with_one_line_naming_them(
    command: str,
    base: list[str],
    flag: list[str],
    env: tuple[str, str],
    line: str,
    where: str,
    tmp_path: Path,
) -> None:
    """The command run with one bad value at ``where``: the error line names it."""
    if where == "flag":
        result, name = _run([command, *base, *flag]), flag[0]
    elif where == "env":
        result, name = _run([command, *base], dict([env])), env[0]
    else:
        config = tmp_path / "bad.toml"
        config.write_text(line + "\n")
        result, name = _run([command, *base, "--config", str(config)]), str(config)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"smockron {command}: error: "), lines
    assert name in lines[0], lines
    assert "Traceback" not in result.output


def test_unknown_file_key_is_named(tmp_path: Path) -> None:
    config = tmp_path / "jarl.toml"
    config.write_text("perod = 3\n")
    result = _run(["jarl", "--config", str(config)])
    assert result.exit_code == 2
    assert f"{config}:perod: unknown setting" in result.stderr


def test_log_options_on_either_side_of_the_subcommand() -> None:
    for args in (
        ["--log-format", "json", "jarl", "--help"],
        ["jarl", "--log-format", "json", "--help"],
    ):
        assert _run(args).exit_code == 0
    result = _run(["jarl", "--log-format", "yaml"])
    assert result.exit_code == 2 and "'yaml' is not one of 'text', 'json'" in result.stderr
    result = _run(["--log-level", "loud", "jarl"])
    assert result.exit_code == 2 and "--log-level" in result.stderr


def test_master_toml_takes_dashes_and_durations_with_units(tmp_path: Path) -> None:
    config = tmp_path / "master.toml"
    config.write_text('stats-interval = "2m"\nskew_tolerance = 3\nrules = ["a:1/s:1"]\n')
    printed = json.loads(_run(["master", "--config", str(config), "--print-settings"]).stdout)
    assert (printed["stats_interval"], printed["skew_tolerance"]) == (120.0, 3)
    config.write_text('stats_interval = "soon"\n')
    result = _run(["master", "--config", str(config)])
    assert result.exit_code == 2
    assert f"{config}:stats_interval: cannot parse duration 'soon'" in result.stderr


def test_log_settings_in_the_file_lose_to_flags_and_environment(tmp_path: Path) -> None:
    """A config file may set log_level/log_format; either flag and the variables win."""
    config = tmp_path / "jarl.toml"
    config.write_text('log_level = "ERROR"\nlog_format = "json"\n')
    base = ["--service", "s", "--requests", "1", "--period", "1", "--ip", "127.0.0.1"]
    cases = [
        ([], {}, logging.ERROR),
        (["--log-level", "DEBUG"], {}, logging.DEBUG),
        ([], {"SMOCKRON_LOG_LEVEL": "WARNING"}, logging.WARNING),
    ]
    for before, env, level in cases:
        args = [*before, "jarl", *base, "--port", "1", "--config", str(config), "--print-settings"]
        assert _run(args, env).exit_code == 0
        assert logging.getLogger().level == level, (before, env)
