"""A domain's rules as the master's config files write them (TOML and the original's YAML).

Both formats give a domain as a mapping: a first rule in its own keys (smockron's
``rate``/``burst``, or the original's ``rate``/``interval``/``burst``), more in
``rules``, and an ``algorithm``; :func:`domain_policy` reads that shape once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from smockron.core.rules import Rule, parse_burst, parse_rate
from smockron.errors import ConfigError, RuleError
from smockron.master.domains import DomainPolicy

FirstRule = Callable[[Mapping[str, Any], str], Rule]
"""Reads a domain's own keys into its first rule (``where`` names it in errors)."""


def domain_policy(
    spec: Any, where: str, first: FirstRule, keys: frozenset[str], algorithm: str
) -> DomainPolicy:
    """A domain's policy: ``first(spec)`` when any of ``keys`` is given, then each of
    ``rules``; ``algorithm`` unless the domain names one."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping with rate and burst, or rules")
    rules = [first(spec, where)] if keys & set(spec) else []
    rules += [rule_item(item, where) for item in spec.get("rules", [])]
    try:
        return DomainPolicy(tuple(rules), str(spec.get("algorithm", algorithm)))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def rule_item(item: Any, where: str) -> Rule:
    """One entry of ``rules``: ``"RATE/UNIT:BURST"`` or ``{rate, burst}`` (smockron's)."""
    if isinstance(item, str):
        rate, _, burst = item.rpartition(":")
        return rule_of({"rate": rate, "burst": burst}, where)
    return rule_of(item, where)


def rule_of(spec: Any, where: str) -> Rule:
    """Smockron's ``{rate, burst}``."""
    if not isinstance(spec, dict) or "rate" not in spec or "burst" not in spec:
        raise ConfigError(f"{where}: a rule needs both rate and burst, got {spec!r}")
    try:
        return Rule(parse_rate(str(spec["rate"])), parse_burst(spec["burst"]))
    except RuleError as exc:
        raise ConfigError(f"{where}: {exc}") from None
