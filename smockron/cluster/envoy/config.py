"""envoyproxy/ratelimit's YAML configuration, read into a lookup tree.

One file holds one domain::

    domain: mongo_cps
    descriptors:
      - key: database
        value: users              # optional: without it the entry matches any value
        rate_limit:
          unit: second            # second | minute | hour | day | month | year
          requests_per_unit: 500
          name: users-limit       # optional, echoed in current_limit.name
        shadow_mode: true         # optional: judged and counted, but always answered OK
      - key: remote_address
        rate_limit:
          unlimited: true
      - key: to_number
        descriptors:              # nested: matched against the next descriptor entry
          - key: from_number
            rate_limit: {unit: hour, requests_per_unit: 10}

Matching follows envoyproxy/ratelimit: each entry of a request descriptor selects a child
by ``key_value``, else by a ``value`` ending in ``*`` that is a prefix of the value, else by
``key`` alone; the limit of the node reached by the last entry applies. ``detailed_metric``
and ``value_to_metric`` are accepted and have no effect; ``replaces`` is accepted and not
implemented.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from smockron.errors import ConfigError

UNIT_WINDOW: dict[str, tuple[int, bool]] = {
    "second": (1_000, False),
    "minute": (0, True),
    "hour": (1, True),
    "day": (2, True),
    "month": (4, True),
    "year": (5, True),
}
"""``(duration, gregorian)`` per unit. Minutes and longer are calendar windows (UTC), as
envoyproxy/ratelimit's windows are aligned to the clock; a second is 1,000 ms from the
first hit. Envoy's enum numbers the same units SECOND=1 .. YEAR=6."""

UNIT_NUMBER: dict[str, int] = {"second": 1, "minute": 2, "hour": 3, "day": 4, "month": 5, "year": 6}
UNIT_NAME: dict[int, str] = {number: name for name, number in UNIT_NUMBER.items()}

_DESCRIPTOR_KEYS = frozenset(
    {"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric",
     "value_to_metric"}
)  # fmt: skip
_RATE_LIMIT_KEYS = frozenset({"unit", "requests_per_unit", "unlimited", "name", "replaces"})


@dataclass(frozen=True, slots=True)
class Limit:
    """A configured limit: ``requests_per_unit`` per ``unit``, or unlimited."""

    requests_per_unit: int
    unit: str
    name: str = ""
    unlimited: bool = False
    shadow_mode: bool = False

    @property
    def window(self) -> tuple[int, bool]:
        """``(duration, gregorian)`` of the token bucket that enforces this limit."""
        return UNIT_WINDOW[self.unit]


@dataclass(slots=True)
class Node:
    """One configured descriptor: its limit (if any) and its nested descriptors."""

    limit: Limit | None = None
    children: dict[str, Node] = field(default_factory=dict)
    """Keyed by ``key_value`` for exact matches and ``key`` for key-only entries."""
    wildcards: list[tuple[str, str, Node]] = field(default_factory=list)
    """``(key, value prefix, node)`` for values ending in ``*``."""

    def child(self, key: str, value: str) -> Node | None:
        node = self.children.get(f"{key}_{value}")
        if node is not None:
            return node
        for wkey, prefix, wnode in self.wildcards:
            if wkey == key and value.startswith(prefix):
                return wnode
        return self.children.get(key)


@dataclass(slots=True)
class EnvoyConfig:
    """Every loaded domain, by name."""

    domains: dict[str, Node] = field(default_factory=dict)

    def find(self, domain: str, entries: Sequence[tuple[str, str]]) -> Limit | None:
        """The limit for a descriptor's entries, or None when no configured limit matches."""
        node = self.domains.get(domain)
        for key, value in entries:
            if node is None:
                return None
            node = node.child(key, value)
        return None if node is None or not entries else node.limit


def load_config(paths: str | Path | Iterable[str | Path]) -> EnvoyConfig:
    """Read one or several YAML files; a directory means its ``*.yaml`` and ``*.yml`` files."""
    if isinstance(paths, str | Path):
        paths = [paths]
    config = EnvoyConfig()
    for path in expand_paths(paths):
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read rate limit config: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{path}: cannot read rate limit config: nested too deeply") from None
        domain, root = parse_domain(document, str(path))
        if domain in config.domains:
            raise ConfigError(f"{path}: duplicate domain {domain!r} in config files")
        config.domains[domain] = root
    return config


def parse_domain(document: Any, where: str = "<config>") -> tuple[str, Node]:
    """One file's document: ``(domain, tree)``."""
    if not isinstance(document, Mapping):
        raise ConfigError(f"{where}: expected a mapping with 'domain' and 'descriptors'")
    unknown = set(document) - {"domain", "descriptors"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(map(str, unknown))}")
    domain = document.get("domain")
    if not isinstance(domain, str) or not domain:
        raise ConfigError(f"{where}: 'domain' must be a non-empty string, got {domain!r}")
    root = Node()
    _add_descriptors(root, _list(document, "descriptors"), f"{where}: {domain}")
    return domain, root


def _list(mapping: Mapping[str, Any], key: str) -> Any:
    value = mapping.get(key)
    return [] if value is None else value


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


def _add_descriptors(parent: Node, items: Any, where: str) -> None:
    if not isinstance(items, list):
        raise ConfigError(f"{where}: 'descriptors' must be a list")
    for item in items:
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: each descriptor must be a mapping, got {item!r}")
        unknown = set(item) - _DESCRIPTOR_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown descriptor key(s) {sorted(map(str, unknown))}")
        key, value = item.get("key"), item.get("value")
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{where}: descriptor 'key' must be a non-empty string")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise ConfigError(f"{where}: descriptor {key!r} has a non-scalar value {value!r}")
        here = f"{where}.{key}" + (f"_{value}" if value is not None else "")
        node = Node(limit=_parse_limit(item, here))
        _add_descriptors(node, _list(item, "descriptors"), here)
        _attach(parent, key, None if value is None else str(value), node, here)


def _attach(parent: Node, key: str, value: str | None, node: Node, where: str) -> None:
    if value is not None and value.endswith("*"):
        parent.wildcards.append((key, value[:-1], node))
        return
    composite = key if value is None else f"{key}_{value}"
    if composite in parent.children:
        raise ConfigError(f"{where}: duplicate descriptor composite key {composite!r}")
    parent.children[composite] = node


def _parse_limit(item: Mapping[str, Any], where: str) -> Limit | None:
    spec = item.get("rate_limit")
    shadow = item.get("shadow_mode", False)
    if not isinstance(shadow, bool):
        raise ConfigError(f"{where}: 'shadow_mode' must be true or false, got {shadow!r}")
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: 'rate_limit' must be a mapping")
    unknown = set(spec) - _RATE_LIMIT_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown rate_limit key(s) {sorted(map(str, unknown))}")
    name = str(spec.get("name") or "")
    if spec.get("unlimited", False) is True:
        if "unit" in spec or "requests_per_unit" in spec:
            raise ConfigError(f"{where}: an unlimited rate_limit must not set unit or requests")
        return Limit(0, "second", name, unlimited=True, shadow_mode=shadow)
    unit = str(spec.get("unit", "")).lower()
    if unit not in UNIT_WINDOW:
        raise ConfigError(f"{where}: invalid rate limit unit {spec.get('unit')!r}")
    requests = spec.get("requests_per_unit")
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
        raise ConfigError(f"{where}: 'requests_per_unit' must be an integer >= 0, got {requests!r}")
    return Limit(requests, unit, name, shadow_mode=shadow)
