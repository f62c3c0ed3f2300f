"""Settings of the master: defaults, then a config file, then command-line flags.

Two file formats. TOML (``*.toml``) says everything the flags say::

    accounting = "tcp://*:10004"
    control = "tcp://*:10005"
    store = "memory://"
    rules = ["api:10/s:20"]            # same syntax as --rule
    algorithms = { api = "gcra" }      # same as --algorithm api=gcra

    [domains.login]                    # or per domain
    rules = ["5/m:5", { rate = "100/d", burst = 100 }]
    algorithm = "history"

The original master's YAML (``*.yaml``/``*.yml``) is read as is: ``server.listen`` is the
accounting address and the control port is one above it; ``datastore`` names the store;
``domains.NAME`` has ``rate`` ("3/sec", "3 per sec") and ``burst``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from smockron.core.rules import Rule, parse_burst, parse_rate, parse_rule_spec
from smockron.errors import ConfigError, RuleError
from smockron.master.engine import DomainPolicy
from smockron.protocol import DEFAULT_LIMITS, Limits

DEFAULT_ACCOUNTING = "tcp://*:10004"
DEFAULT_CONTROL = "tcp://*:10005"


@dataclass(frozen=True)
class MasterSettings:
    """Everything ``smockron master`` can be told."""

    accounting: str = DEFAULT_ACCOUNTING
    control: str = DEFAULT_CONTROL
    store: str = "memory://"
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
    domains: Mapping[str, DomainPolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("hwm", "queue", "batch", "max_domain", "max_identifier", "max_loginfo"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("stats_interval", "skew_tolerance"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {value!r}")


_SCALARS = {f.name for f in fields(MasterSettings)} - {"domains"}


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
    scalars = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = set(scalars) - _SCALARS
    if unknown:
        raise ConfigError(f"unknown settings {sorted(unknown)}")
    settings = replace(settings, **scalars)
    return replace(settings, domains=_with_flags(settings.domains, rules, algorithms))


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


def _from_toml(data: dict[str, Any], path: Path) -> MasterSettings:
    data = dict(data)
    nested = data.pop("master", None)  # a shared file may keep these under [master]
    if isinstance(nested, dict):
        data.update(nested)
    rules = _list_of_str(data.pop("rules", []), "rules", path)
    algos = data.pop("algorithms", {})
    if not isinstance(algos, dict):
        raise ConfigError(f"{str(path)!r}: 'algorithms' must be a table of DOMAIN = ALGORITHM")
    domains = _domains(data.pop("domains", {}), path)
    unknown = set(data) - _SCALARS
    if unknown:
        raise ConfigError(f"{str(path)!r}: unknown settings {sorted(unknown)}")
    settings = MasterSettings(**data, domains=domains)
    flags = [f"{d}={a}" for d, a in algos.items()]
    return replace(settings, domains=_with_flags(domains, rules, flags))


def _from_yaml(data: Any, path: Path) -> MasterSettings:
    if not isinstance(data, dict):
        raise ConfigError(f"{str(path)!r}: expected a mapping at the top level")
    values: dict[str, Any] = {}
    server = data.get("server") or {}
    if not isinstance(server, dict):
        raise ConfigError(f"{str(path)!r}: 'server' must be a mapping")
    if "listen" in server:
        values["accounting"], values["control"] = _listen_pair(server["listen"])
    if "datastore" in data:
        values["store"] = _datastore_uri(data["datastore"])
    return MasterSettings(**values, domains=_domains(data.get("domains") or {}, path))


def _listen_pair(listen: Any) -> tuple[str, str]:
    """``server.listen`` (a port, ``host:port`` or ``tcp://host:port``) and port + 1."""
    text = str(listen)
    if "://" not in text:
        text = f"tcp://*:{text}" if text.isdigit() else f"tcp://{text}"
    base, _, port = text.rpartition(":")
    if not port.isdigit() or not base:
        raise ConfigError(f"server.listen {listen!r} has no port")
    return text, f"{base}:{int(port) + 1}"


def _datastore_uri(store: Any) -> str:
    """A store URI from the original's ``datastore``: a URI, a name, or a mapping."""
    if isinstance(store, str):
        if "://" in store:
            return store
        if store in ("memory", "redis"):
            return "memory://" if store == "memory" else "redis://127.0.0.1:6379/0"
    if isinstance(store, dict):
        spec = store.get("redis", store)
        if isinstance(spec, dict) and (
            "redis" in store or store.get("type") == "redis" or "host" in spec
        ):
            host = spec.get("host", "127.0.0.1")
            return f"redis://{host}:{spec.get('port', 6379)}/{spec.get('db', 0)}"
        if store.get("type") == "memory":
            return "memory://"
    raise ConfigError(f"cannot understand datastore {store!r}: use a URI such as redis://h:p/0")


def _domains(raw: Any, path: Path) -> dict[str, DomainPolicy]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{str(path)!r}: 'domains' must map domain names to rules")
    return {str(name): _domain(str(name), spec, path) for name, spec in raw.items()}


def _domain(name: str, spec: Any, path: Path) -> DomainPolicy:
    where = f"{str(path)!r}, domain {name!r}"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping with rate and burst, or rules")
    rules: list[Rule] = []
    if "rate" in spec or "burst" in spec:
        rules.append(_rule(spec, where))
    for item in spec.get("rules", []):
        if isinstance(item, str):
            rate, _, burst = item.rpartition(":")
            rules.append(_rule({"rate": rate, "burst": burst}, where))
        else:
            rules.append(_rule(item, where))
    return DomainPolicy(tuple(rules), str(spec.get("algorithm", "history")))


def _rule(spec: Any, where: str) -> Rule:
    if not isinstance(spec, dict) or "rate" not in spec or "burst" not in spec:
        raise ConfigError(f"{where}: a rule needs both rate and burst, got {spec!r}")
    return Rule(parse_rate(str(spec["rate"])), parse_burst(spec["burst"]))


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
