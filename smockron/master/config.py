"""Settings of the master: defaults, then a config file, then command-line flags.

Two file formats. TOML (``*.toml``) says everything the flags say (keys with underscores
or dashes, durations in seconds or with a unit)::

    accounting = "tcp://127.0.0.1:10004"
    control = "tcp://127.0.0.1:10005"
    store = "memory://"
    rules = ["api:10/s:20"]            # same syntax as --rule
    algorithms = { api = "gcra" }      # same as --algorithm api=gcra

    [domains.login]                    # or per domain
    rules = ["5/m:5", { rate = "100/d", burst = 100 }]
    algorithm = "history"

The original Smockron master's YAML (``*.yaml``/``*.yml``) is read as it reads it
(:mod:`smockron.master.original_config`).

See docs/master.md ("Configuration files") for every spelling and what differs.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from smockron.core.rules import Rule, parse_rule_spec
from smockron.errors import ConfigError, RuleError
from smockron.master.domains import DomainPolicy
from smockron.master.original_config import yaml_settings
from smockron.master.rule_specs import domain_policy, rule_of
from smockron.master.stores.uri import parse_store_uri
from smockron.settings import parse_duration, parse_master
from smockron.wire.codec import DEFAULT_LIMITS, Limits

DEFAULT_ACCOUNTING = "tcp://127.0.0.1:10004"
DEFAULT_CONTROL = "tcp://127.0.0.1:10005"
_SMOCKRON_KEYS = frozenset({"rate", "burst"})
"""A domain's own keys that make its first rule (the rest go in ``rules``)."""


@dataclass(frozen=True)
class MasterSettings:
    """Everything ``smockron master`` can be told."""

    accounting: str = DEFAULT_ACCOUNTING
    control: str = DEFAULT_CONTROL
    store: str = "memory://"
    snapshot: str | None = None
    """The memory store's snapshot file: written every ``snapshot_interval`` and on
    shutdown, read at start, so a restarted master does not forgive everyone."""
    snapshot_interval: float = 30.0
    metrics: str | None = None
    stats_interval: float = 60.0
    skew_tolerance: float = 2.0
    """Seconds; see the engine's clock-skew policy."""
    hwm: int = 100_000
    """ZeroMQ high-water mark of both sockets (messages)."""
    queue: int = 100_000
    """The master's own bounded queue between receiving and processing (messages)."""
    batch: int = 2_000
    """At most this many messages are processed in one go."""
    max_domain: int = DEFAULT_LIMITS.max_domain
    max_identifier: int = DEFAULT_LIMITS.max_identifier
    max_loginfo: int = DEFAULT_LIMITS.max_loginfo
    """Decoder limits (bytes): a bigger domain, identifier or loginfo frame is malformed."""
    curve_secret: str | None = None
    """This master's CURVE ``.key_secret`` file (see smockron/curve.py)."""
    curve_clients: str | None = None
    """Directory of the allowed gatekeepers' public ``.key`` files."""
    insecure_bind: bool = False
    """Bind a non-loopback address without keys (otherwise refused)."""
    peers: tuple[str, ...] = ()
    """The other masters of this master's fleet, each ``ACC_ADDR,CTL_ADDR`` (empty: a
    fleet of one, as a master has always been)."""
    advertise: str | None = None
    """``ACC_ADDR,CTL_ADDR``: how the fleet's other masters and gatekeepers name this
    master (default: ``accounting,control``). Needed when binding a wildcard address."""
    replicas: int = 2
    """How many masters of the fleet hold each shard of identifiers."""
    domains: Mapping[str, DomainPolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "peers", tuple(self.peers))
        for name in (
            "hwm",
            "queue",
            "batch",
            "max_domain",
            "max_identifier",
            "max_loginfo",
            "replicas",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.snapshot_interval_invalid():
            raise ConfigError(
                f"snapshot_interval must be a number > 0, got {self.snapshot_interval!r}"
            )
        for name in ("stats_interval", "skew_tolerance"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {value!r}")

        check_fleet(self)

    @property
    def name(self) -> str:
        """This master's name in its fleet: the accounting address others reach it at."""
        return fleet_name(self.advertise or f"{self.accounting},{self.control}")

    def snapshot_interval_invalid(self) -> bool:
        value = self.snapshot_interval
        return not isinstance(value, int | float) or isinstance(value, bool) or not value > 0


_SCALARS = {f.name for f in fields(MasterSettings)} - {"domains"}


def fleet_name(spec: str) -> str:
    """A master's name in a fleet, from ``ACC_ADDR,CTL_ADDR``: its accounting address."""
    return parse_master(spec)[0]


_WILDCARD = re.compile(r"^tcp://(\*|0\.0\.0\.0|\[::\]|\[\*\]):")


def check_fleet(settings: MasterSettings) -> None:
    """Peers name masters as gatekeepers reach them: a wildcard name is no name."""
    for spec in settings.peers:
        if not isinstance(spec, str):
            raise ConfigError(f"peers must be ACC_ADDR,CTL_ADDR strings, got {spec!r}")
        fleet_name(spec)
    if settings.advertise is not None:
        fleet_name(settings.advertise)
    # the fleet's full list may name this master too (one list for every master of a
    # StatefulSet): it is not its own peer
    object.__setattr__(
        settings, "peers", tuple(p for p in settings.peers if fleet_name(p) != settings.name)
    )


def check_advertised(settings: MasterSettings) -> None:
    """A master with peers must be named as the fleet reaches it (checked once every
    setting is in: the file may leave ``advertise`` to a flag)."""
    if settings.peers and settings.advertise is None and _WILDCARD.match(settings.accounting):
        raise ConfigError(
            f"accounting {settings.accounting!r} is a wildcard address: with peers, say how "
            "the fleet reaches this master (--advertise ACC_ADDR,CTL_ADDR)"
        )


def limits(settings: MasterSettings) -> Limits:
    """The codec limits the settings ask for."""
    return replace(
        DEFAULT_LIMITS,
        max_domain=settings.max_domain,
        max_identifier=settings.max_identifier,
        max_loginfo=settings.max_loginfo,
    )


def load_settings(
    path: str | Path | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    rules: Sequence[str] = (),
    algorithms: Sequence[str] = (),
) -> MasterSettings:
    """Defaults, then the file at ``path``, then flags (``overrides``, ``--rule``...)."""
    settings = MasterSettings()
    if path is not None:
        settings = read_file(Path(path))
    scalars = {k: v for k, v in (overrides or {}).items() if v is not None and v != ()}
    unknown = set(scalars) - _SCALARS
    if unknown:
        raise ConfigError(f"unknown settings {sorted(unknown)}")
    settings = replace(settings, **scalars)
    settings = replace(settings, domains=_with_flags(settings.domains, rules, algorithms))
    try:
        check_store(settings)
        check_advertised(settings)
    except ConfigError as exc:
        raise ConfigError(f"{str(path)!r}: {exc}" if path is not None else str(exc)) from None
    return settings


def check_store(settings: MasterSettings) -> None:
    """The store URI is usable, and its layout can hold every domain's states."""
    store = parse_store_uri(settings.store)
    if settings.snapshot and store.scheme != "memory":
        raise ConfigError(
            f"snapshot {settings.snapshot!r} is for the memory store; {settings.store!r} "
            "keeps its states itself: drop the snapshot"
        )
    if store.layout != "original":
        return
    for name, policy in settings.domains.items():
        if policy.algorithm != "gcra" or len(policy.rules) != 1:
            raise ConfigError(
                f"store {settings.store!r} keeps the original Smockron master's layout, one "
                f"GCRA value per identifier, but domain {name!r} has {len(policy.rules)} "
                f"rule(s) and runs {policy.algorithm!r}: give it one rule and gcra"
            )


def read_file(path: Path) -> MasterSettings:
    """A TOML or (original master) YAML file, chosen by extension."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            return _from_yaml(yaml.safe_load(text) or {}, path)
        return _from_toml(tomllib.loads(text), path)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot parse {str(path)!r}: {exc}") from None
    except RuleError as exc:
        raise ConfigError(f"{str(path)!r}: {exc}") from None


_DURATIONS = ("stats_interval", "skew_tolerance", "snapshot_interval")
"""Seconds; the file may also write them with a unit (``"30s"``), as the flags."""


def _from_toml(data: dict[str, Any], path: Path) -> MasterSettings:
    data = dict(data)
    nested = data.pop("master", None)  # a shared file may keep these under [master]
    if isinstance(nested, dict):
        data.update(nested)
    data = {key.replace("-", "_"): value for key, value in data.items()}  # as the flags
    for key in _DURATIONS:
        if isinstance(data.get(key), str):
            try:
                data[key] = parse_duration(data[key])
            except ConfigError as exc:
                raise ConfigError(f"{path}:{key}: {exc}") from None
    rules = _list_of_str(data.pop("rules", []), "rules", path)
    algos = data.pop("algorithms", {})
    if not isinstance(algos, dict):
        raise ConfigError(f"{str(path)!r}: 'algorithms' must be a table of DOMAIN = ALGORITHM")
    domains = _domains(data.pop("domains", {}), path)
    unknown = set(data) - _SCALARS
    if unknown:
        raise ConfigError(f"{str(path)!r}: unknown settings {sorted(unknown)}")
    try:
        settings = MasterSettings(**data, domains=domains)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    flags = [f"{d}={a}" for d, a in algos.items()]
    return replace(settings, domains=_with_flags(domains, rules, flags))


def _from_yaml(data: Any, path: Path) -> MasterSettings:
    values, domains = yaml_settings(data, path)
    return MasterSettings(**values, domains=domains)


def _domains(raw: Any, path: Path) -> dict[str, DomainPolicy]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{str(path)!r}: 'domains' must map domain names to rules")
    where = f"{str(path)!r}, domain"
    return {
        str(name): domain_policy(spec, f"{where} {str(name)!r}", rule_of, _SMOCKRON_KEYS, "history")
        for name, spec in raw.items()
    }


def _list_of_str(value: Any, what: str, path: Path) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{str(path)!r}: {what!r} must be a list of strings")
    return value


def _with_flags(
    domains: Mapping[str, DomainPolicy], rules: Sequence[str], algorithms: Sequence[str]
) -> dict[str, DomainPolicy]:
    """``--rule`` replaces a domain's rules; ``--algorithm DOMAIN=ALG`` its algorithm."""
    result = dict(domains)
    flagged: dict[str, list[Rule]] = {}
    for spec in rules:
        domain, rule = parse_rule_spec(spec)
        flagged.setdefault(domain, []).append(rule)
    for domain, domain_rules in flagged.items():
        old = result.get(domain)
        result[domain] = DomainPolicy(tuple(domain_rules), old.algorithm if old else "history")
    for spec in algorithms:
        domain, sep, algorithm = spec.partition("=")
        if not sep or not domain:
            raise ConfigError(f"cannot parse algorithm {spec!r}: expected DOMAIN=gcra")
        if domain not in result:
            raise ConfigError(f"algorithm given for domain {domain!r}, which has no rules")
        result[domain] = DomainPolicy(result[domain].rules, algorithm)
    return result
