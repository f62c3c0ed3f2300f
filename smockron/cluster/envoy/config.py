"""envoyproxy/ratelimit's YAML configuration, read into a lookup tree.

One file holds one domain (with ``MERGE_DOMAIN_CONFIG`` several files may share one)::

    domain: mongo_cps
    descriptors:
      - key: database
        value: users              # optional: without it the entry matches any value
        rate_limit:
          unit: second            # second | minute | hour | day | week | month | year
          requests_per_unit: 500
          name: users-limit       # optional, echoed in current_limit.name
          replaces: [{name: x}]   # the limit named x does not apply when this one matches
        shadow_mode: true         # judged and counted, but answered OK
        quota_mode: true          # over: OVER_LIMIT overall only if every quota is over
        metadata: {tier: gold}    # RESPONSE_DYNAMIC_METADATA: returned when it passes
        detailed_metric: true     # stats key carries the request's values
      - key: path
        value: /api/*/users       # ``*`` anywhere matches any run of characters
        share_threshold: true     # every matching value shares one counter
        value_to_metric: true     # stats key carries the request's value at this level
      - key: to_number
        descriptors:              # nested: matched against the next descriptor entry
          - key: from_number
            rate_limit: {unit: hour, requests_per_unit: 10}

Keys are checked as upstream checks them: a key upstream does not know anywhere is an
error; a known key in an unexpected place is ignored. Matching and stats keys follow
upstream's ``GetLimit`` (``src/config/config_impl.go``): each entry of a request descriptor
selects a child by ``key_value``, else by the first wildcard pattern it matches, else by
``key`` alone; the limit of the node reached by the last entry applies.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.struct_pb2 import Struct

from smockron.cluster.envoy.settings import EnvoySettings
from smockron.errors import ConfigError

UNIT_WINDOW: dict[str, tuple[int, bool]] = {
    "second": (1_000, False),
    "minute": (0, True),
    "hour": (1, True),
    "day": (2, True),
    "week": (7 * 86_400_000, False),
    "month": (4, True),
    "year": (5, True),
}
"""``(duration, gregorian)`` per unit. Minutes, hours and days are UTC calendar windows,
which are upstream's epoch-aligned windows; seconds and weeks are epoch-aligned fixed
windows as upstream's (a week starts on Thursday 00:00 UTC, as 1970-01-01 did); months and
years are calendar months and years (upstream: 30 and 365 days from 1970, see docs)."""

UNIT_NUMBER: dict[str, int] = {
    "second": 1,
    "minute": 2,
    "hour": 3,
    "day": 4,
    "month": 5,
    "year": 6,
    "week": 7,
}
"""``RateLimitResponse.RateLimit.Unit`` numbers (and ``envoy.type.v3.RateLimitUnit``'s)."""
UNIT_NAME: dict[int, str] = {number: name for name, number in UNIT_NUMBER.items()}

VALID_KEYS = frozenset(
    {
        "domain",
        "key",
        "value",
        "descriptors",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "unlimited",
        "shadow_mode",
        "quota_mode",
        "name",
        "replaces",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    }
)
"""Every key upstream accepts, at any level (``validKeys`` in config_impl.go)."""

MAX_UINT32 = 2**32 - 1
"""The largest value of envoyproxy/ratelimit's uint32 fields (requests_per_unit, remaining)."""


@dataclass(frozen=True, slots=True)
class Limit:
    """A configured limit: ``requests_per_unit`` per ``unit``, or unlimited."""

    requests_per_unit: int
    unit: str
    name: str = ""
    unlimited: bool = False
    shadow_mode: bool = False
    quota_mode: bool = False
    replaces: tuple[str, ...] = ()
    detailed_metric: bool = False

    @property
    def window(self) -> tuple[int, bool]:
        """``(duration, gregorian)`` of the token bucket that enforces this limit."""
        return UNIT_WINDOW[self.unit]


@dataclass(frozen=True, slots=True)
class Match:
    """What a descriptor resolves to: its limit, upstream's stats key for it, the wildcard
    pattern that replaces the value of each entry in the counter's key (``share_threshold``;
    ``""`` keeps the value), and the matched node's ``metadata``."""

    limit: Limit
    stats_key: str
    share_patterns: tuple[str, ...] = ()
    metadata: Mapping[str, Any] | None = None


@dataclass(slots=True)
class DescriptorNode:
    """One configured descriptor: its limit (if any) and its nested descriptors."""

    limit: Limit | None = None
    children: dict[str, DescriptorNode] = field(default_factory=dict)
    """Keyed by ``key_value`` (wildcard patterns included, literally) or ``key``."""
    wildcards: list[tuple[str, list[str]]] = field(default_factory=list)
    """``(key_value pattern, pattern split on *)`` of the children whose value has a ``*``,
    in file order: the first that matches wins."""
    value_to_metric: bool = False
    share_threshold: bool = False
    metadata: dict[str, Any] | None = None


@dataclass(slots=True)
class EnvoyConfig:
    """Every loaded domain, by name."""

    domains: dict[str, DescriptorNode] = field(default_factory=dict)

    def find(self, domain: str, entries: Sequence[tuple[str, str]]) -> Limit | None:
        """The limit for a descriptor's entries, or None when no configured limit matches."""
        match = self.lookup(domain, entries)
        return None if match is None else match.limit

    def lookup(
        self,
        domain: str,
        entries: Sequence[tuple[str, str]],
        override: tuple[int, str] | None = None,
    ) -> Match | None:
        """Upstream's ``GetLimit``: None for an unknown domain (even with an ``override``,
        ``(requests_per_unit, unit)`` sent by Envoy) or when no limit matches."""
        root = self.domains.get(domain)
        if root is None:
            return None
        if override is not None:
            key = ".".join(k if not v else f"{k}_{v}" for k, v in entries)
            return Match(Limit(override[0], override[1]), f"{domain}.{key}")
        return _walk(root, domain, entries)


def wildcard_match(parts: Sequence[str], value: str) -> bool:
    """Whether ``value`` matches a pattern split on ``*`` (each ``*`` matches any run of
    characters, the empty one included)."""
    if len(parts) == 1:
        return parts[0] == value
    first, last = parts[0], parts[-1]
    if not value.startswith(first) or not value.endswith(last):
        return False
    if len(value) < sum(map(len, parts)):
        return False
    rest = value[len(first) : len(value) - len(last)]
    for part in parts[1:-1]:
        at = rest.find(part)
        if at < 0:
            return False
        rest = rest[at + len(part) :]
    return True


def _walk(root: DescriptorNode, domain: str, entries: Sequence[tuple[str, str]]) -> Match | None:
    detailed, by_value = [domain], [domain]
    shared: dict[int, str] = {}
    found: tuple[DescriptorNode, Limit] | None = None
    parent = root
    for i, (key, value) in enumerate(entries):
        detailed.append(f"{key}_{value}")
        node, pattern, by_exact_value = _child(parent, key, value)
        if node is None:
            by_value.append(key)
            break
        if pattern and node.share_threshold:
            shared[i] = pattern.removeprefix(f"{key}_")
        by_value.append(_metric_part(key, value, node, pattern, shared.get(i, ""), by_exact_value))
        if node.limit is not None and i == len(entries) - 1:
            found = (node, node.limit)
        if not node.children:
            break
        parent = node
    if found is None:
        return None
    node, limit = found
    patterns = tuple(shared.get(i, "") for i in range(len(entries))) if shared else ()
    if limit.detailed_metric:
        stats_key = _shared_key(domain, entries, patterns) if patterns else ".".join(detailed)
    else:
        stats_key = ".".join(by_value)
    return Match(limit, stats_key, patterns, node.metadata)


def _child(parent: DescriptorNode, key: str, value: str) -> tuple[DescriptorNode | None, str, bool]:
    """(the node an entry leads to, the wildcard pattern it matched or "", whether by its
    value): the exact ``key_value`` first, then wildcards in order, then ``key`` alone."""
    composite = f"{key}_{value}"
    node = parent.children.get(composite)
    if node is not None:
        return node, "", True
    for candidate, parts in parent.wildcards:
        if wildcard_match(parts, composite):
            return parent.children[candidate], candidate, True
    return parent.children.get(key), "", False


def _metric_part(
    key: str, value: str, node: DescriptorNode, pattern: str, shared: str, by_exact_value: bool
) -> str:
    """One level of the stats key without ``detailed_metric`` (``value_to_metric`` rules)."""
    if pattern:
        shown = shared or (value if node.value_to_metric else pattern.removeprefix(f"{key}_"))
    elif by_exact_value or node.value_to_metric:
        shown = value
    else:
        shown = ""
    return f"{key}_{shown}" if shown else key


def _shared_key(domain: str, entries: Sequence[tuple[str, str]], patterns: Sequence[str]) -> str:
    parts = [domain]
    for (key, value), pattern in zip(entries, patterns, strict=True):
        shown = pattern or value
        parts.append(f"{key}_{shown}" if shown else key)
    return ".".join(parts)


def load_config(
    paths: str | Path | Iterable[str | Path], *, merge_domains: bool | None = None
) -> EnvoyConfig:
    """Read one or several YAML files; a directory means its ``*.yaml`` and ``*.yml`` files.

    ``merge_domains`` (default: ``MERGE_DOMAIN_CONFIG``) lets several files add descriptors
    to one domain; otherwise a domain in two files is an error.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    if merge_domains is None:
        merge_domains = EnvoySettings.from_env(os.environ).merge_domains
    config = EnvoyConfig()
    for path in expand_paths(paths):
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read rate limit config: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{path}: cannot read rate limit config: nested too deeply") from None
        _add_document(config, document, str(path), merge_domains)
    return config


def parse_domain(document: Any, where: str = "<config>") -> tuple[str, DescriptorNode]:
    """One file's document: ``(domain, tree)``."""
    config = EnvoyConfig()
    _add_document(config, document, where, merge=False)
    return next(iter(config.domains.items()))


def _add_document(config: EnvoyConfig, document: Any, where: str, merge: bool) -> None:
    if not isinstance(document, Mapping):
        raise ConfigError(f"{where}: expected a mapping with 'domain' and 'descriptors'")
    _check_keys(document, where, "")
    domain = _scalar(document.get("domain"), where)
    if not domain:
        raise ConfigError(
            f"{where}: config file cannot have empty domain: 'domain' must be a non-empty string"
        )
    root = config.domains.get(domain)
    if root is not None and not merge:
        raise ConfigError(f"{where}: duplicate domain {domain!r} in config files")
    if root is None:
        root = DescriptorNode()
    _add_descriptors(root, document.get("descriptors"), f"{where}: {domain}", domain)
    config.domains[domain] = root


_LEVEL = {
    "": "",
    "descriptors": "descriptor ",
    "rate_limit": "rate_limit ",
    "replaces": "replaces ",
}


def _check_keys(mapping: Mapping[Any, Any], where: str, level: str) -> None:
    """Upstream's ``validateYamlKeys``: string keys it knows, lists of mappings only."""
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where}: config error, key is not of type string: {key}")
        if key not in VALID_KEYS:
            kind = _LEVEL.get(level, "")
            raise ConfigError(f"{where}: config error, unknown {kind}key {key!r}")
        if key == "metadata":
            continue
        if isinstance(value, list):
            for item in value:
                if not isinstance(item, Mapping):
                    raise ConfigError(
                        f"{where}: config error, yaml file contains list of type other "
                        f"than map: {item}"
                    )
                _check_keys(item, where, key)
        elif isinstance(value, Mapping):
            _check_keys(value, where, key)


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """The files a list of paths names: a directory stands for its YAML files, sorted."""
    files: list[Path] = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml")))
        else:
            files.append(path)
    return files


def _add_descriptors(parent: DescriptorNode, items: Any, where: str, parent_key: str) -> None:
    if items is None:
        return
    if not isinstance(items, list):
        raise ConfigError(f"{where}: 'descriptors' must be a list")
    for item in items:
        key, value = _scalar(item.get("key"), where), _scalar(item.get("value"), where)
        if not key:
            raise ConfigError(
                f"{where}: descriptor has empty key: 'key' must be a non-empty string"
            )
        composite = f"{key}_{value}" if value else key
        here = f"{parent_key}.{composite}"
        if composite in parent.children:
            raise ConfigError(f"{where}: duplicate descriptor composite key {here!r}")
        node = _node(item, f"{where}.{composite}", composite)
        _add_descriptors(node, item.get("descriptors"), f"{where}.{composite}", here)
        if "*" in composite:
            parent.wildcards.append((composite, composite.split("*")))
        parent.children[composite] = node


def _node(item: Mapping[str, Any], where: str, composite: str) -> DescriptorNode:
    share = _flag(item, "share_threshold", where)
    if share and "*" not in composite:
        raise ConfigError(
            f"{where}: share_threshold can only be used with wildcard values "
            f"(containing '*'), but found key {composite!r}"
        )
    return DescriptorNode(
        limit=_parse_limit(item, where),
        value_to_metric=_flag(item, "value_to_metric", where),
        share_threshold=share,
        metadata=_metadata(item.get("metadata"), where),
    )


def _scalar(value: Any, where: str) -> str:
    """A YAML scalar as upstream's string fields read it (``true``, ``5``); None is ``""``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ConfigError(f"{where}: expected a string, got {value!r}")


def _flag(item: Mapping[str, Any], key: str, where: str) -> bool:
    value = item.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key!r} must be true or false, got {value!r}")
    return value


def _metadata(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: error parsing metadata: expected a mapping, got {value!r}")
    if not value:
        return None
    plain = _plain(value)
    try:
        Struct().update(plain)  # what a response will carry: fail at load, not per call
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: error parsing metadata: {exc}") from None
    return plain  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    """YAML data as a protobuf Struct takes it: string keys, dates as ISO text."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


def _parse_limit(item: Mapping[str, Any], where: str) -> Limit | None:
    shadow, quota = _flag(item, "shadow_mode", where), _flag(item, "quota_mode", where)
    detailed = _flag(item, "detailed_metric", where)
    spec = item.get("rate_limit")
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: 'rate_limit' must be a mapping")
    name = _scalar(spec.get("name"), where)
    replaces = _replaces(spec.get("replaces"), name, where)
    unlimited = _flag(spec, "unlimited", where)
    unit = _scalar(spec.get("unit"), where).lower()
    if unlimited:
        if unit in UNIT_WINDOW:
            raise ConfigError(f"{where}: should not specify rate limit unit when unlimited")
        requests = _requests(spec, where, required=False)
        return Limit(requests, "second", name, True, shadow, quota, replaces, detailed)
    if unit not in UNIT_WINDOW:
        raise ConfigError(f"{where}: invalid rate limit unit {_scalar(spec.get('unit'), where)!r}")
    requests = _requests(spec, where, required=True)
    return Limit(requests, unit, name, False, shadow, quota, replaces, detailed)


def _requests(spec: Mapping[str, Any], where: str, *, required: bool) -> int:
    requests = spec.get("requests_per_unit")
    if requests is None and not required:
        return 0
    if (
        isinstance(requests, bool)
        or not isinstance(requests, int)
        or not 0 <= requests <= MAX_UINT32
    ):
        raise ConfigError(
            f"{where}: 'requests_per_unit' must be an integer >= 0 (at most 2^32-1), "
            f"got {requests!r}"
        )
    return requests


def _replaces(value: Any, name: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{where}: 'replaces' must be a list of {{name: ...}}")
    names = tuple(_scalar(entry.get("name"), where) for entry in value)
    for replaced in names:
        if not replaced:
            raise ConfigError(f"{where}: should not have an empty replaces entry")
        if replaced == name:
            raise ConfigError(f"{where}: replaces should not contain name of same descriptor")
    return names
