"""DThrottle settings: defaults of the original, a TOML file, then flags on top.

A TOML file holds the same settings as the flags (names with underscores)::

    listen = ["tcp:127.0.0.1:6969", "unix:/tmp/dthrottle.sock"]
    burst = 10
    rate = 1.0                 # tokens per second, or "60/m"
    report_interval = 5        # seconds, 1..3600
    max_tag_length = 256
    whitelist = ["10.", "monitoring:"]
    peers = ["10.0.0.2:6969", "10.0.0.3:6969"]   # unicast transport
    peer_bind = "0.0.0.0:6969"                     # where unicast reports arrive (UDP)
    multicast = "239.255.69.69:6969"               # multicast transport
    multicast_interface = "0.0.0.0"
    multicast_ttl = 1
    max_datagram = 1400

    [[rule]]
    prefix = "api:"
    burst = 100
    rate = 10.0
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from smockron import settings
from smockron.core.rules import parse_rate
from smockron.daemons.dthrottle.algorithm import (
    DEFAULT_MAX_ENTRIES,
    PrefixRule,
    RuleTable,
    whitelist,
)
from smockron.daemons.dthrottle.report import DEFAULT_MAX_DATAGRAM, check_sizes
from smockron.errors import ConfigError

DEFAULT_TCP = "tcp:127.0.0.1:6969"
DEFAULT_UNIX = "unix:/tmp/dthrottle.sock"
DEFAULT_PEER_PORT = 6969


@dataclass(frozen=True, slots=True)
class Listen:
    """A stream socket to serve queries on: ``tcp:HOST:PORT`` or ``unix:PATH``."""

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.kind == "unix" else f"tcp:{self.host}:{self.port}"


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` (port 0: any free one), by smockron's one parser."""
    try:
        host, port = settings.parse_host_port(text, listen=True)
    except ConfigError as exc:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r} ({exc})") from None
    if not host:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r} (no host)")
    return host, port


def parse_listen(text: str) -> Listen:
    kind, sep, rest = text.partition(":")
    if sep and kind == "unix" and rest:
        return Listen("unix", path=rest)
    if sep and kind == "tcp":
        host, port = parse_host_port(rest, "--listen tcp:")
        return Listen("tcp", host, port)
    raise ConfigError(f"--listen must be tcp:HOST:PORT or unix:PATH, got {text!r}")


def parse_rate_value(value: object) -> float:
    """A rate in tokens per second: a number (the original's flag) or ``RATE/UNIT``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        rate = float(value)
    else:
        try:
            rate = float(str(value))
        except ValueError:
            rate = parse_rate(str(value))
    if not rate > 0:
        raise ConfigError(f"rate must be > 0 tokens per second, got {value!r}")
    return rate


def _int(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{what} must be an integer in {low}..{high}, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{what} must be an integer in {low}..{high}, got {value!r}") from None
    if not low <= number <= high:
        raise ConfigError(f"{what} must be in {low}..{high}, got {number}")
    return number


@dataclass(frozen=True)
class DThrottleConfig:
    """Everything a daemon needs; ``from_sources`` builds it from a file and flags."""

    listen: tuple[Listen, ...] = (parse_listen(DEFAULT_TCP), parse_listen(DEFAULT_UNIX))
    burst: int = 10
    rate: float = 1.0
    report_interval: float = 5.0
    max_tag_length: int = 256
    max_entries: int = DEFAULT_MAX_ENTRIES
    rules: tuple[PrefixRule, ...] = ()
    whitelist: tuple[bytes, ...] = ()
    peers: tuple[tuple[str, int], ...] = ()
    peer_bind: tuple[str, int] | None = None
    multicast: tuple[str, int] | None = None
    multicast_interface: str = "0.0.0.0"
    multicast_ttl: int = 1
    max_datagram: int = DEFAULT_MAX_DATAGRAM

    def __post_init__(self) -> None:
        if not 1 <= self.report_interval <= 3600:
            raise ConfigError(f"report interval must be 1..3600 s, got {self.report_interval}")
        if not 1 <= self.max_tag_length <= 65535:
            raise ConfigError(f"max tag length must be 1..65535, got {self.max_tag_length}")
        check_sizes(self.max_tag_length, self.max_datagram)
        if not self.listen:
            raise ConfigError("nothing to listen on: give at least one --listen")
        self.rule_table()  # refuse duplicate prefixes now, not at the first query

    def rule_table(self) -> RuleTable:
        default = PrefixRule(b"", self.burst, self.rate)
        return RuleTable(default, [*self.rules, *(whitelist(p) for p in self.whitelist)])

    @property
    def udp_bind(self) -> tuple[str, int] | None:
        """Where unicast reports arrive; defaults to port 6969 once peers are listed."""
        if self.peer_bind is not None:
            return self.peer_bind
        return ("0.0.0.0", DEFAULT_PEER_PORT) if self.peers else None

    @classmethod
    def from_sources(
        cls, file: Path | None = None, flags: dict[str, Any] | None = None
    ) -> DThrottleConfig:
        """Defaults, overridden by the TOML ``file``, overridden by non-empty ``flags``."""
        raw: dict[str, Any] = load_toml(file) if file is not None else {}
        for key, value in (flags or {}).items():
            if value not in (None, (), []):
                raw[key] = value
        return cls.from_mapping(raw)

    @classmethod
    def from_mapping(cls, raw: dict[str, Any]) -> DThrottleConfig:
        known = {f.name for f in fields(cls)} | {"rule"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown DThrottle setting(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        converters: dict[str, Callable[[Any], Any]] = {
            "listen": lambda v: tuple(parse_listen(str(x)) for x in _list(v, "listen")),
            "burst": lambda v: _int(v, "burst", 1, 2**31),
            "rate": parse_rate_value,
            "report_interval": lambda v: _seconds(v, "report_interval"),
            "max_tag_length": lambda v: _int(v, "max_tag_length", 1, 65535),
            "max_entries": lambda v: _int(v, "max_entries", 1, 2**31),
            "whitelist": lambda v: tuple(_tag(x) for x in _list(v, "whitelist")),
            "peers": lambda v: tuple(parse_host_port(str(x), "peer") for x in _list(v, "peers")),
            "peer_bind": lambda v: parse_host_port(str(v), "peer_bind"),
            "multicast": lambda v: parse_host_port(str(v), "multicast"),
            "multicast_interface": str,
            "multicast_ttl": lambda v: _int(v, "multicast_ttl", 0, 255),
            "max_datagram": lambda v: _int(v, "max_datagram", 32, 65507),
            "rules": lambda v: tuple(v),
            "rule": lambda v: tuple(_rule(x) for x in _list(v, "rule")),
        }
        for key, value in raw.items():
            converted = converters[key](value)
            values["rules" if key == "rule" else key] = converted
        return replace(cls(), **values) if values else cls()


def _list(value: object, what: str) -> list[Any]:
    if isinstance(value, list | tuple):
        return list(value)
    raise ConfigError(f"{what} must be a list, got {value!r}")


def _seconds(value: object, what: str) -> float:
    """A duration: a number of seconds, or text with a unit (``5s``, ``500ms``, ``1m``)."""
    if isinstance(value, str):
        try:
            return settings.parse_duration(value)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    return _number(value, what)


def _number(value: object, what: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a number, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number, got {value!r}") from None


def _tag(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise ConfigError(f"a tag prefix must be a string, got {value!r}")


def _rule(value: object) -> PrefixRule:
    if isinstance(value, PrefixRule):
        return value
    if (
        not isinstance(value, dict)
        or set(value) - {"prefix", "burst", "rate"}
        or ("prefix" not in value)
    ):
        raise ConfigError(f"a [[rule]] needs prefix, burst and rate, got {value!r}")
    return PrefixRule(
        _tag(value["prefix"]),
        _int(value.get("burst", 10), "rule burst", 1, 2**31),
        parse_rate_value(value.get("rate", 1.0)),
    )


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
