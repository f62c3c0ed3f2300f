"""Every exception smockron raises on purpose, in one hierarchy::

    SmockronError
     ├── ConfigError            bad configuration (file, flag or environment variable)
     │    └── RuleError         a rule or rate that cannot be parsed
     ├── ProtocolError          bytes from the network that do not form a valid message
     ├── InvalidParams          (also ValueError) a rate-limit item no algorithm can apply;
     │                          the cluster answers it as that item's ``error``
     ├── ClientError            the cluster client: a call failed as a whole
     │    ├── ClientUnavailable no server answers, or the connection broke mid-call
     │    ├── ClientTimeout     (also TimeoutError) the deadline passed
     │    └── ItemError         ``check()``: the server answered the item with an error
     └── internal signals, caught where they are raised, never seen by users:
          ├── Aborted           a gRPC handler on a bridged thread aborts its call
          ├── LeaseLost         etcd discovery: our lease or key is gone, register again
          └── MalformedEvent    (also ValueError) a Kubernetes watch event we cannot use

Every message names the offending value, so a log line is enough to find the cause.
The client's errors are also importable from :mod:`smockron.cluster.client`.
"""

from __future__ import annotations

import typing

if typing.TYPE_CHECKING:
    import grpc

    from smockron.cluster.model import RateLimitResponse

__all__ = [
    "Aborted",
    "ClientError",
    "ClientTimeout",
    "ClientUnavailable",
    "ConfigError",
    "InvalidParams",
    "ItemError",
    "LeaseLost",
    "MalformedEvent",
    "ProtocolError",
    "RuleError",
    "SmockronError",
]


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


class InvalidParams(SmockronError, ValueError):
    """Parameters no algorithm can apply; the message becomes the item's ``error``."""


class ClientError(SmockronError):
    """A call failed as a whole; ``code`` is the gRPC status code (None if not from gRPC)."""

    def __init__(
        self, message: str, code: grpc.StatusCode | None = None, details: str = ""
    ) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class ClientUnavailable(ClientError):
    """No server answers at the address, or the connection broke mid-call."""


class ClientTimeout(ClientError, TimeoutError):
    """The call's deadline passed before the server answered."""


class ItemError(ClientError):
    """``check()``: the server answered the item with an error (e.g. a bad algorithm)."""

    def __init__(self, message: str, response: RateLimitResponse) -> None:
        super().__init__(message)
        self.response = response


class Aborted(SmockronError):
    """Raised by ``LoopContext.abort``; the bridge aborts the real call with it."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class LeaseLost(SmockronError):
    """Our etcd lease expired or was revoked, or our key vanished: register again."""


class MalformedEvent(SmockronError, ValueError):
    """A watch line or object that is not a usable EndpointSlice event."""
