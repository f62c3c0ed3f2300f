"""One exception hierarchy for all of smockron.

    SmockronError
     ├── ConfigError        bad configuration (file, flag or environment variable)
     │    └── RuleError     a rule or rate that cannot be parsed
     └── ProtocolError      bytes from the network that do not form a valid message

Every message names the offending value, so a log line is enough to find the cause.
"""

from __future__ import annotations


class SmockronError(Exception):
    """Base class of every error smockron raises on purpose."""


class ConfigError(SmockronError):
    """Configuration that cannot be used."""


class RuleError(ConfigError):
    """A rate-limit rule, rate or burst that cannot be parsed."""


class ProtocolError(SmockronError):
    """A malformed message; ``reason`` is a short stable token usable as a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
