"""What a client's calls travel on: the gRPC target for its addresses, the choice
between the native channel (smockron.cluster._nativeclient) and grpcio, and one mapping
of every transport's failures (grpcio's RpcError, the native channel's and the HTTP
transport's CallError) to the ClientError tree of smockron.errors."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import grpc

from smockron.compiled import load
from smockron.errors import ClientError, ClientTimeout, ClientUnavailable

nativeclient: Any = load("_nativeclient")  # built only where libgrpc++ is installed

NATIVE_AVAILABLE = nativeclient is not None
"""True when the native channel (smockron.cluster._nativeclient) is built."""


class _NeverRaised(Exception):
    """Stands for _nativeclient.CallError when the extension is not built."""


NativeCallError: type[Exception] = _NeverRaised if nativeclient is None else nativeclient.CallError
CODES = {code.value[0]: code for code in grpc.StatusCode}
PATH = "/pb.gubernator.V1/"
GET_RATE_LIMITS = PATH + "GetRateLimits"
HTTP_PATH = "/v1/GetRateLimits"
DEFAULT_ADDRESS = "127.0.0.1:1051"

Transport: TypeAlias = Literal["auto", "grpc", "http"]
"""Where a client sends GetRateLimits: ``auto`` lone checks over HTTP when an
``http_address`` is given, the rest over gRPC; ``grpc`` all over gRPC; ``http`` all
over HTTP."""


def rpc_error(exc: grpc.RpcError, address: str, method: str) -> ClientError:
    code: grpc.StatusCode | None = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    return status_error(code, details, address, method)


def coded_error(exc: Exception, address: str, method: str) -> ClientError:
    """A ClientError from a CallError(code, details) of _nativeclient or the HTTP
    transport, as from grpcio."""
    code, details = exc.args
    return status_error(CODES.get(code, grpc.StatusCode.UNKNOWN), details, address, method)


def status_error(
    code: grpc.StatusCode | None, details: str, address: str, method: str
) -> ClientError:
    message = f"{method} on {address} failed: {code.name if code else 'error'}: {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ClientTimeout(message, code, details)
    if code == grpc.StatusCode.UNAVAILABLE:
        return ClientUnavailable(message, code, details)
    return ClientError(message, code, details)


def grpc_target(addresses: str | Sequence[str]) -> str:
    """One gRPC target for one or several ``host:port`` addresses.

    Several addresses must be IP literals: they become an ``ipv4:``/``ipv6:`` target that
    the channel balances round-robin, skipping nodes that are down. A single address (or
    any gRPC target such as ``dns:///gubernator.svc:1051``) is used as it is.
    """
    items = [addresses] if isinstance(addresses, str) else list(addresses)
    items = [a.strip() for item in items for a in item.split(",") if a.strip()]
    if not items:
        raise ValueError("no server address given")
    if len(items) == 1:
        return items[0]
    families = {_ip_family(a) for a in items}
    if len(families) != 1 or None in families:
        raise ValueError(
            f"several addresses must all be IPv4 or all IPv6 literals, got {items}; "
            "for host names give one target such as dns:///gubernator.example:1051"
        )
    return f"{families.pop()}:{','.join(items)}"


def _ip_family(address: str) -> str | None:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return None
    try:
        return f"ipv{ipaddress.ip_address(host.strip('[]')).version}"
    except ValueError:
        return None


def use_native(
    native: bool | None,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]],
) -> bool:
    """The native channel unless asked not to, not built, TLS (grpcio credentials
    objects cannot be handed to libgrpc++), or an option value it cannot take."""
    plain = all(isinstance(value, int | str) for _, value in options)
    if native is None:
        return NATIVE_AVAILABLE and credentials is None and plain
    if native and not plain:
        raise ValueError("native=True takes only int and str channel option values")
    if native and not NATIVE_AVAILABLE:
        raise ValueError("native=True but smockron.cluster._nativeclient is not built")
    if native and credentials is not None:
        raise ValueError("native=True does not do TLS; leave native unset to use grpcio")
    return native
