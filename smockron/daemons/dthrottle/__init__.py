"""DThrottle, a drop-in: the pure throttle, its settings, its daemon, its command."""

from __future__ import annotations

from smockron.daemons.dthrottle.algorithm import NO, OK, PrefixRule, RuleTable, Throttle, whitelist
from smockron.daemons.dthrottle.config import DThrottleConfig, Listen, parse_listen
from smockron.daemons.dthrottle.server import DThrottleDaemon, DThrottleStats

__all__ = [
    "NO",
    "OK",
    "DThrottleConfig",
    "DThrottleDaemon",
    "DThrottleStats",
    "Listen",
    "PrefixRule",
    "RuleTable",
    "Throttle",
    "parse_listen",
    "whitelist",
]
