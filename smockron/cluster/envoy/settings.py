"""envoyproxy/ratelimit's environment variables that change what the Envoy front answers.

=================================  ========================================  ================
variable                           meaning                                   default
=================================  ========================================  ================
``SHADOW_MODE``                    every answer is OK; verdicts still count   false
``QUOTA_MODE``                     every limit is a quota (see service.py)    false
``RESPONSE_DYNAMIC_METADATA``      fill ``dynamic_metadata`` of answers       false
``MERGE_DOMAIN_CONFIG``            files with the same domain are merged      false
``LIMIT_RESPONSE_HEADERS_ENABLED`` add the three headers below                false
``LIMIT_LIMIT_HEADER``             name of the limit header                   RateLimit-Limit
``LIMIT_REMAINING_HEADER``         name of the remaining header           RateLimit-Remaining
``LIMIT_RESET_HEADER``             name of the reset header                   RateLimit-Reset
``NEAR_LIMIT_RATIO``               share of a limit after which hits count    0.8
                                   as ``near_limit``
=================================  ========================================  ================

Booleans are read as Go's ``strconv.ParseBool`` reads them (upstream uses it); a bad value
is a ConfigError naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from smockron.errors import ConfigError

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


@dataclass(frozen=True, slots=True)
class EnvoySettings:
    shadow_mode: bool = False
    quota_mode: bool = False
    dynamic_metadata: bool = False
    merge_domains: bool = False
    response_headers: bool = False
    limit_header: str = "RateLimit-Limit"
    remaining_header: str = "RateLimit-Remaining"
    reset_header: str = "RateLimit-Reset"
    near_limit_ratio: float = 0.8

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EnvoySettings:
        """The settings the variables set, defaults for the rest (``os.environ`` if None)."""
        env = os.environ if env is None else env
        default = cls()
        return cls(
            shadow_mode=_bool(env, "SHADOW_MODE", default.shadow_mode),
            quota_mode=_bool(env, "QUOTA_MODE", default.quota_mode),
            dynamic_metadata=_bool(env, "RESPONSE_DYNAMIC_METADATA", default.dynamic_metadata),
            merge_domains=_bool(env, "MERGE_DOMAIN_CONFIG", default.merge_domains),
            response_headers=_bool(env, "LIMIT_RESPONSE_HEADERS_ENABLED", default.response_headers),
            limit_header=env.get("LIMIT_LIMIT_HEADER") or default.limit_header,
            remaining_header=env.get("LIMIT_REMAINING_HEADER") or default.remaining_header,
            reset_header=env.get("LIMIT_RESET_HEADER") or default.reset_header,
            near_limit_ratio=_ratio(env, "NEAR_LIMIT_RATIO", default.near_limit_ratio),
        )


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    text = env.get(name, "")
    if not text:
        return default
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name}: must be true or false, got {text!r}")


def _ratio(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}: must be a number, got {text!r}") from None
    if not 0 <= value <= 1:
        raise ConfigError(f"{name}: must be between 0 and 1, got {text!r}")
    return value
