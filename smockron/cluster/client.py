"""A Python client, sync and asyncio, for the Gubernator v2 ``pb.gubernator.V1`` gRPC API.

It speaks the wire Gubernator speaks, so the same code talks to a smockron cluster or to
Gubernator itself. Requests and responses are smockron.cluster.model values.

    with Client("127.0.0.1:1051") as client:
        resp = client.check("requests_per_sec", "account:42", 1, 100, SECOND)
        if resp.status is Status.OVER_LIMIT: ...

    async with AsyncClient(["10.0.0.1:1051", "10.0.0.2:1051"]) as client:  # round-robin
        resps = await client.get_rate_limits([RateLimitRequest(...), ...])

Errors (all from smockron.errors.SmockronError):

    ClientError              the call as a whole failed; carries ``code`` and ``details``
     ├── ClientUnavailable   nobody answers at the address, or the connection broke
     ├── ClientTimeout       the deadline passed (also a TimeoutError)
     └── ItemError           ``check()`` only: the server answered this item with an error

``get_rate_limits`` never raises ItemError: per-item errors stay in each response's
``error``, as on the wire. Concurrent ``check`` calls (threads of one Client, tasks on
one AsyncClient's loop) are coalesced into one call while another is in flight
(smockron.cluster.coalesce; ``coalesce=False`` turns it off; a check with its own
``timeout`` goes alone). Lists longer than the server's limit of 1,000 per call are
split into several calls; the answers come back in request order.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

import grpc
import grpc.aio

from smockron.cluster.coalesce import AsyncCoalescer, Coalescer
from smockron.cluster.convert import request_to_pb, response_from_pb
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.errors import ClientError, ClientTimeout, ClientUnavailable, ItemError

pb_grpc: Any = gubernator_pb2_grpc  # generated without type hints

# the model types are re-exported so one import gives a user everything
__all__ = [
    "HOUR",
    "MAX_BATCH_SIZE",
    "MILLISECOND",
    "MINUTE",
    "SECOND",
    "Algorithm",
    "AsyncClient",
    "Behavior",
    "Client",
    "ClientError",
    "ClientTimeout",
    "ClientUnavailable",
    "HealthCheck",
    "ItemError",
    "RateLimitRequest",
    "RateLimitResponse",
    "Status",
    "grpc_target",
]

MILLISECOND = 1
SECOND = 1000 * MILLISECOND
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
"""Durations on the wire are milliseconds; Gubernator's Go client has the same constants."""

MAX_BATCH_SIZE = 1000
"""Gubernator rejects a GetRateLimits call with more items than this."""

DEFAULT_ADDRESS = "127.0.0.1:1051"


@dataclass(frozen=True, slots=True)
class HealthCheck:
    status: str
    """``healthy`` or ``unhealthy``."""
    message: str
    peer_count: int
    advertise_address: str
    local_peers: tuple[PeerInfo, ...] = ()
    """The nodes of the answering node's data center, itself included."""
    region_peers: tuple[PeerInfo, ...] = ()
    """The nodes of other data centers."""

    @property
    def healthy(self) -> bool:
        return self.status == "healthy"


def _error(exc: grpc.RpcError, address: str, method: str) -> ClientError:
    code: grpc.StatusCode | None = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    message = f"{method} on {address} failed: {code.name if code else 'error'}: {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ClientTimeout(message, code, details)
    if code == grpc.StatusCode.UNAVAILABLE:
        return ClientUnavailable(message, code, details)
    return ClientError(message, code, details)


def _ms(duration: int | timedelta) -> int:
    if isinstance(duration, timedelta):
        return int(duration.total_seconds() * 1000)
    return int(duration)


def _request(
    name: str,
    key: str,
    hits: int,
    limit: int,
    duration: int | timedelta,
    algorithm: Algorithm,
    behavior: Behavior,
    burst: int,
    metadata: Mapping[str, str] | None,
) -> RateLimitRequest:
    return RateLimitRequest(
        name=name,
        unique_key=key,
        hits=hits,
        limit=limit,
        duration=_ms(duration),
        algorithm=Algorithm(algorithm),
        behavior=Behavior(behavior),
        burst=burst,
        metadata=dict(metadata or {}),
    )


def _batches(requests: Sequence[RateLimitRequest]) -> list[pb.GetRateLimitsReq]:
    return [
        pb.GetRateLimitsReq(requests=[request_to_pb(r) for r in requests[i : i + MAX_BATCH_SIZE]])
        for i in range(0, len(requests), MAX_BATCH_SIZE)
    ]


def _responses(
    sent: pb.GetRateLimitsReq, got: pb.GetRateLimitsResp, address: str
) -> list[RateLimitResponse]:
    if len(got.responses) != len(sent.requests):
        raise ClientError(
            f"GetRateLimits on {address}: {len(got.responses)} responses "
            f"for {len(sent.requests)} requests"
        )
    return [response_from_pb(r) for r in got.responses]


def _checked(resp: RateLimitResponse, name: str, key: str) -> RateLimitResponse:
    if resp.error:
        raise ItemError(f"rate limit {name}/{key}: {resp.error}", resp)
    return resp


def _health(msg: pb.HealthCheckResp) -> HealthCheck:
    return HealthCheck(
        msg.status,
        msg.message,
        msg.peer_count,
        msg.advertise_address,
        tuple(PeerInfo(p.grpc_address, data_center=p.data_center) for p in msg.local_peers),
        tuple(PeerInfo(p.grpc_address, data_center=p.data_center) for p in msg.region_peers),
    )


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


class _Base:
    def __init__(
        self,
        address: str | Sequence[str],
        timeout: float,
        credentials: grpc.ChannelCredentials | None,
        options: Sequence[tuple[str, Any]],
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout}")
        self.address = grpc_target(address)
        self.timeout = timeout
        self._credentials = credentials
        # round_robin spreads calls over every address and routes around dead ones
        self._options = list(options)
        if not any(name == "grpc.lb_policy_name" for name, _ in self._options):
            self._options.append(("grpc.lb_policy_name", "round_robin"))

    def _deadline(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout


class Client(_Base):
    """Blocking client; one gRPC channel, safe to share between threads."""

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        *,
        timeout: float = 5.0,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        coalesce: bool = True,
    ) -> None:
        super().__init__(address, timeout, credentials, options)
        if credentials is None:
            self._channel = grpc.insecure_channel(self.address, options=self._options)
        else:
            self._channel = grpc.secure_channel(self.address, credentials, options=self._options)
        self._stub = pb_grpc.V1Stub(self._channel)
        self.coalescer = Coalescer(self.get_rate_limits) if coalesce else None
        """Concurrent ``check`` calls of this client's threads go in one GetRateLimits."""

    def get_rate_limits(
        self, requests: Sequence[RateLimitRequest], *, timeout: float | None = None
    ) -> list[RateLimitResponse]:
        """One response per request, in order; per-item errors are in ``error``."""
        out: list[RateLimitResponse] = []
        for batch in _batches(requests):
            try:
                got = self._stub.GetRateLimits(batch, timeout=self._deadline(timeout))
            except grpc.RpcError as exc:
                raise _error(exc, self.address, "GetRateLimits") from exc
            out.extend(_responses(batch, got, self.address))
        return out

    def check(
        self,
        name: str,
        key: str,
        hits: int,
        limit: int,
        duration: int | timedelta,
        *,
        algorithm: Algorithm = Algorithm.TOKEN_BUCKET,
        behavior: Behavior = Behavior.BATCHING,
        burst: int = 0,
        metadata: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> RateLimitResponse:
        """Count ``hits`` (0 = just look) against ``limit`` per ``duration`` (ms or
        timedelta); raises ItemError if the server rejects the item."""
        req = _request(name, key, hits, limit, duration, algorithm, behavior, burst, metadata)
        if self.coalescer is not None and timeout is None:
            return _checked(self.coalescer.check(req), name, key)
        return _checked(self.get_rate_limits([req], timeout=timeout)[0], name, key)

    def health_check(self, *, timeout: float | None = None) -> HealthCheck:
        try:
            msg = self._stub.HealthCheck(pb.HealthCheckReq(), timeout=self._deadline(timeout))
        except grpc.RpcError as exc:
            raise _error(exc, self.address, "HealthCheck") from exc
        return _health(msg)

    def live_check(self, *, timeout: float | None = None) -> None:
        """Returns if the server process answers at all (Gubernator's LiveCheck)."""
        try:
            self._stub.LiveCheck(pb.LiveCheckReq(), timeout=self._deadline(timeout))
        except grpc.RpcError as exc:
            raise _error(exc, self.address, "LiveCheck") from exc

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient(_Base):
    """asyncio client on a ``grpc.aio`` channel; create and use it inside one event loop."""

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        *,
        timeout: float = 5.0,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        coalesce: bool = True,
    ) -> None:
        super().__init__(address, timeout, credentials, options)
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=self._options)
        else:
            opts = self._options
            self._channel = grpc.aio.secure_channel(self.address, credentials, options=opts)
        self._stub = pb_grpc.V1Stub(self._channel)
        self.coalescer = AsyncCoalescer(self.get_rate_limits) if coalesce else None
        """Concurrent ``check`` calls on this client's loop go in one GetRateLimits."""

    async def get_rate_limits(
        self, requests: Sequence[RateLimitRequest], *, timeout: float | None = None
    ) -> list[RateLimitResponse]:
        """One response per request, in order; batches of 1,000 are sent concurrently."""
        batches = _batches(requests)
        answers = await asyncio.gather(*(self._call(b, timeout) for b in batches))
        return [resp for answer in answers for resp in answer]

    async def _call(
        self, batch: pb.GetRateLimitsReq, timeout: float | None
    ) -> list[RateLimitResponse]:
        try:
            got = await self._stub.GetRateLimits(batch, timeout=self._deadline(timeout))
        except grpc.RpcError as exc:
            raise _error(exc, self.address, "GetRateLimits") from exc
        return _responses(batch, got, self.address)

    async def check(
        self,
        name: str,
        key: str,
        hits: int,
        limit: int,
        duration: int | timedelta,
        *,
        algorithm: Algorithm = Algorithm.TOKEN_BUCKET,
        behavior: Behavior = Behavior.BATCHING,
        burst: int = 0,
        metadata: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> RateLimitResponse:
        """Count ``hits`` (0 = just look) against ``limit`` per ``duration`` (ms or
        timedelta); raises ItemError if the server rejects the item."""
        req = _request(name, key, hits, limit, duration, algorithm, behavior, burst, metadata)
        if self.coalescer is not None and timeout is None:
            return _checked(await self.coalescer.check(req), name, key)
        return _checked((await self.get_rate_limits([req], timeout=timeout))[0], name, key)

    async def health_check(self, *, timeout: float | None = None) -> HealthCheck:
        try:
            msg = await self._stub.HealthCheck(pb.HealthCheckReq(), timeout=self._deadline(timeout))
        except grpc.RpcError as exc:
            raise _error(exc, self.address, "HealthCheck") from exc
        return _health(msg)

    async def live_check(self, *, timeout: float | None = None) -> None:
        try:
            await self._stub.LiveCheck(pb.LiveCheckReq(), timeout=self._deadline(timeout))
        except grpc.RpcError as exc:
            raise _error(exc, self.address, "LiveCheck") from exc

    async def close(self) -> None:
        await self._channel.close(grace=None)

    aclose = close

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
