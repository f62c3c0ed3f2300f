"""A Python client, sync and asyncio, for the Gubernator v2 ``pb.gubernator.V1`` gRPC API.

It speaks the wire Gubernator speaks, so the same code talks to a smockron cluster or to
Gubernator itself. Requests and responses are smockron.cluster.model values.

    with Client("127.0.0.1:1051") as client:
        resp = client.check("requests_per_sec", "account:42", 1, 100, SECOND)
        if resp.status is Status.OVER_LIMIT: ...

    async with AsyncClient(["10.0.0.1:1051", "10.0.0.2:1051"]) as client:
        resps = await client.get_rate_limits([RateLimitRequest(...), ...])

Each check goes to the node that owns its key (smockron.cluster.client._routing: the
ring learned from a node's HealthCheck, kept up to date), so no node forwards it; a
batch is split by owner, the parts sent in parallel. The given address(es) (several:
balanced round-robin) are where the node list is asked for, and where calls go while
no ring is known (Gubernator lists no peers) or no owner answers. ``route=False`` sends
everything to the given address(es), as Envoy or Gubernator's clients do.

Errors (all from smockron.errors.SmockronError):

    ClientError              the call as a whole failed; carries ``code`` and ``details``
     ├── ClientUnavailable   nobody answers at the address, or the connection broke
     ├── ClientTimeout       the deadline passed (also a TimeoutError)
     └── ItemError           ``check()`` only: the server answered this item with an error

``get_rate_limits`` never raises ItemError: per-item errors stay in each response's
``error``, as on the wire. Concurrent ``check`` calls (threads of one Client, tasks on
one AsyncClient's loop) are coalesced into one call while another is in flight
(smockron.cluster.client._coalesce; inside the native channel when a Client's checks all go
through it; ``coalesce=False`` turns it off; a check with its own ``timeout`` goes
alone). Lists longer than the server's limit of 1,000 per call are
split into several calls; the answers come back in request order.

Transport: when the optional extension smockron.cluster._nativeclient is built (it
needs libgrpc++, as the native server does) a plain-text client calls through it, at a
fraction of grpcio's CPU per call; otherwise, for TLS (``credentials``), or with
``native=False``, it calls through grpcio. Both send the same bytes (the generated
protobuf classes encode) and raise the same errors; ``client.native`` says which is in
use.

Either client given the node's HTTP gateway (``http_address``) sends lone checks, the
sequential caller's case, as ``POST /v1/GetRateLimits`` over a kept-alive HTTP/1.1
connection (smockron.cluster.client._http): less client CPU than a gRPC call.
Batches (``get_rate_limits``, coalesced checks) stay on gRPC, where protobuf costs less
per item than JSON; ``transport="http"`` sends them over HTTP too, ``transport="grpc"``
never uses HTTP. Same answers, same errors either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeAlias, TypeVar

import grpc
import grpc.aio

from smockron.cluster.client._coalesce import AsyncCoalescer, Coalescer, NativeCoalescer
from smockron.cluster.client._http import (
    AsyncHttpTransport,
    CallError,
    HttpTransport,
    decode_responses,
    encode_requests,
)
from smockron.cluster.client._routing import REFRESH, OwnerRing
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.model import (
    MAX_BATCH,
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.compiled import load
from smockron.core.hashring import DEFAULT_REPLICAS
from smockron.errors import ClientError, ClientTimeout, ClientUnavailable, ItemError

_nativeclient: Any = load("_nativeclient")  # built only where libgrpc++ is installed

pb_grpc: Any = gubernator_pb2_grpc  # generated without type hints

NATIVE_AVAILABLE = _nativeclient is not None
"""True when the native channel (smockron.cluster._nativeclient) is built."""


class _NeverRaised(Exception):
    """Stands for _nativeclient.CallError when the extension is not built."""


_CallError: type[Exception] = _NeverRaised if _nativeclient is None else _nativeclient.CallError
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_PATH = "/pb.gubernator.V1/"
_GET_RATE_LIMITS = _PATH + "GetRateLimits"
_HTTP_PATH = "/v1/GetRateLimits"

Transport: TypeAlias = Literal["auto", "grpc", "http"]
"""Where a client sends GetRateLimits: ``auto`` lone checks over HTTP when an
``http_address`` is given, the rest over gRPC; ``grpc`` all over gRPC; ``http`` all
over HTTP."""

# the model types are re-exported so one import gives a user everything (annotated: mypy
# cannot infer it through smockron.cluster's re-export once _Base is generic)
__all__: list[str] = [
    "HOUR",
    "MAX_BATCH_SIZE",
    "MILLISECOND",
    "MINUTE",
    "NATIVE_AVAILABLE",
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

MAX_BATCH_SIZE = MAX_BATCH
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
    return _status_error(code, details, address, method)


def _coded_error(exc: Exception, address: str, method: str) -> ClientError:
    """A ClientError from a CallError(code, details) of _nativeclient or httpclient, as
    from grpcio."""
    code, details = exc.args
    return _status_error(_CODES.get(code, grpc.StatusCode.UNKNOWN), details, address, method)


def _status_error(
    code: grpc.StatusCode | None, details: str, address: str, method: str
) -> ClientError:
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
    # conversions only when needed: this runs once per check, and the enum calls alone
    # cost twice the rest
    return RateLimitRequest(
        name,
        key,
        hits,
        limit,
        duration if type(duration) is int else _ms(duration),
        algorithm if type(algorithm) is Algorithm else Algorithm(algorithm),
        behavior if type(behavior) is Behavior else Behavior(behavior),
        burst,
        dict(metadata) if metadata else {},
    )


def _batches(requests: Sequence[RateLimitRequest]) -> list[pb.GetRateLimitsReq]:
    """The same message convert.request_to_pb gives, built in place: an empty item per
    request, its fields set one by one and zero fields left unset, at under half the
    CPU of keyword arguments (paid per check, by a lone one and in a coalesced call)."""
    out = []
    for i in range(0, len(requests), MAX_BATCH_SIZE):
        msg = pb.GetRateLimitsReq()
        add = msg.requests.add
        for r in requests[i : i + MAX_BATCH_SIZE]:
            item = add()
            item.name = r.name
            item.unique_key = r.unique_key
            item.hits = r.hits
            item.limit = r.limit
            item.duration = r.duration
            if r.algorithm:
                item.algorithm = r.algorithm  # type: ignore[assignment]
            if r.behavior:
                item.behavior = r.behavior  # type: ignore[assignment]
            if r.burst:
                item.burst = r.burst
            if r.metadata:
                item.metadata.update(r.metadata)
            if r.created_at is not None:
                item.created_at = r.created_at
        out.append(msg)
    return out


def _responses(
    sent: pb.GetRateLimitsReq, got: pb.GetRateLimitsResp, address: str
) -> list[RateLimitResponse]:
    """As convert.response_from_pb for each, inlined: this runs once per check."""
    if len(got.responses) != len(sent.requests):
        raise ClientError(
            f"GetRateLimits on {address}: {len(got.responses)} responses "
            f"for {len(sent.requests)} requests"
        )
    return [_response(m) for m in got.responses]


def _single(
    sent: pb.GetRateLimitsReq, got: pb.GetRateLimitsResp, address: str
) -> RateLimitResponse:
    """The answer to a one-request call: ``_responses`` without the list machinery (a
    lone check's path, where every microsecond is paid per check)."""
    if len(got.responses) != 1:
        _responses(sent, got, address)  # raises the count error
    return _response(got.responses[0])


def _response(m: pb.RateLimitResp) -> RateLimitResponse:
    status = Status.OVER_LIMIT if m.status == pb.OVER_LIMIT else Status.UNDER_LIMIT
    md = m.metadata
    # a comprehension reads the protobuf map at a third of dict()'s cost
    metadata = {key: md[key] for key in md} if md else {}
    return RateLimitResponse(status, m.limit, m.remaining, m.reset_time, m.error, metadata)


def _checked(resp: RateLimitResponse, name: str, key: str) -> RateLimitResponse:
    if resp.error:
        raise ItemError(f"rate limit {name}/{key}: {resp.error}", resp)
    return resp


_ATTEMPTS = 3
"""Nodes a routed call tries: its owner, then the next ones as they fail to answer."""
_HEALTH_TIMEOUT = 2.0
"""At most this long (seconds) to ask a node for the node list."""


def _plan(ring: OwnerRing, requests: Sequence[RateLimitRequest]) -> dict[str | None, list[int]]:
    """The indexes of ``requests`` by owner (None: no ring yet)."""
    owner = ring.owner
    groups: dict[str | None, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(owner(f"{r.name}_{r.unique_key}"), []).append(i)
    return groups


def _merge(
    n: int, groups: Iterable[list[int]], answers: Iterable[list[RateLimitResponse]]
) -> list[RateLimitResponse]:
    """The owners' answers back in request order."""
    out: list[RateLimitResponse] = [_NO_ANSWER] * n
    for idx, answer in zip(groups, answers, strict=True):
        for i, resp in zip(idx, answer, strict=True):
            out[i] = resp
    return out


_NO_ANSWER = RateLimitResponse(error="no answer")


def _field1(item: bytes) -> bytes:
    """A message holding ``item`` as its one field 1 (GetRateLimitsReq's ``requests``)."""
    n, size = len(item), bytearray()
    while n > 0x7F:
        size.append(n & 0x7F | 0x80)
        n >>= 7
    size.append(n)
    return b"\x0a" + bytes(size) + item


def _only_field1(raw: bytes) -> bytes | None:
    """The one field 1 of ``raw`` (GetRateLimitsResp's one response), or None when
    ``raw`` is anything else (several, none, other fields)."""
    if not raw or raw[0] != 0x0A:
        return None
    n = shift = 0
    i = 1
    while i < len(raw) and i < 6:
        byte = raw[i]
        n |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return raw[i:] if len(raw) - i == n else None
        shift += 7
    return None


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


def _use_native(
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


_Http = TypeVar("_Http", HttpTransport, AsyncHttpTransport)


class _Base(Generic[_Http]):
    def __init__(
        self,
        address: str | Sequence[str],
        timeout: float,
        credentials: grpc.ChannelCredentials | None,
        options: Sequence[tuple[str, Any]],
        native: bool | None,
        http: tuple[Callable[..., _Http], str | None, ssl.SSLContext | None, Transport],
    ) -> None:
        """``http``: the HTTP transport class of this client (sync or asyncio) and the
        user's ``http_address``, ``ssl_context`` and ``transport``."""
        http_class, http_address, ssl_context, transport = http
        if transport not in ("auto", "grpc", "http"):
            raise ValueError(f"transport must be auto, grpc or http, got {transport!r}")
        if transport == "http" and not http_address:
            raise ValueError("transport='http' needs the gateway's http_address")
        if http_address and credentials is not None and ssl_context is None:
            raise ValueError("the gateway is on TLS too: give ssl_context with credentials")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout}")
        self.http: _Http | None = None
        """The HTTP/1.1 transport lone checks take, or None: they take gRPC."""
        if http_address and transport != "grpc":
            self.http = http_class(http_address, ssl_context=ssl_context)
        self._batches_over_http = transport == "http"
        self.address = grpc_target(address)
        self.timeout = timeout
        self._credentials = credentials
        # round_robin spreads calls over every address and routes around dead ones
        self._options = list(options)
        if not any(name == "grpc.lb_policy_name" for name, _ in self._options):
            self._options.append(("grpc.lb_policy_name", "round_robin"))
        self.native = _use_native(native, credentials, self._options)
        """True: calls go through smockron.cluster._nativeclient; False: through grpcio."""
        self._native: Any = None
        if self.native:
            self._native = _nativeclient.Channel(self.address, self._options)

    def _deadline(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    def _grpcio_channel(self, insecure: Any, secure: Any) -> Any:
        """A grpcio channel from ``insecure``/``secure`` (grpc's or grpc.aio's channel
        factories) when the native channel is not used; else None."""
        if self._native is not None:
            return None
        if self._credentials is None:
            return insecure(self.address, options=self._options)
        return secure(self.address, self._credentials, options=self._options)

    def _route(self, coalesced: Callable[..., Any] | None, lone: Callable[..., Any]) -> None:
        """Set where checks go (see ``_via``): the coalescer's ``check``, if coalescing,
        and the lone path, which takes a ``timeout``."""
        self._coalesced = coalesced
        self._lone = lone

    def _via(self, timeout: float | None) -> Callable[[RateLimitRequest], Any]:
        """What sends a check: the coalescer, unless it is off or the check has its own
        ``timeout`` (it then goes alone). One place for both clients' ``check``."""
        if timeout is not None:
            return partial(self._lone, timeout=timeout)
        return self._coalesced or self._lone

    def _routing(
        self, route: bool, ring: tuple[float, str, int], node_args: dict[str, Any]
    ) -> None:
        """Set up sending each check to its owner (smockron.cluster.client._routing):
        ``ring`` is (refresh seconds, hash, replicas); ``node_args`` what a client of one
        node is built with. Off without ``route`` and for the HTTP gateway (the client
        knows the nodes' gRPC addresses only)."""
        refresh, hash_name, replicas = ring
        self.ring: OwnerRing | None = None
        """The client's copy of the cluster's ring; None: every call goes to ``address``."""
        if route and self.http is None:
            self.ring = OwnerRing(replicas=replicas, hash=hash_name, refresh=refresh)
        self._node_args = node_args
        self._nodes: dict[str, Self] = {}
        self._nodes_lock = threading.Lock()
        self._seed_name = ""
        """The ring's name for the node at ``address`` (its advertised address)."""

    def _node(self, name: str) -> Self:
        """The client (unrouted) of the node ``name``: this one for the node at
        ``address``, else one made on first use."""
        node = self._nodes.get(name)
        if node is not None:
            return node
        with self._nodes_lock:
            node = self._nodes.get(name)
            if node is None:
                same = name in (self.address, self._seed_name)
                make: Callable[..., Self] = type(self)
                node = self if same else make(name, route=False, **self._node_args)
                self._nodes[name] = node
            return node

    def _nodes_to_ask(self) -> list[Self]:
        """Where to ask for the node list: ``address``, then the nodes known and up
        (``address`` last when it is known to be down: no wait on it first)."""
        ring = self.ring
        assert ring is not None
        others: list[Self] = [self._node(n) for n in ring.nodes if n not in ring.down]
        others = [node for node in others if node is not self]
        return [*others, self] if self._seed_name in ring.down else [self, *others]

    def _took(self, via: Self, health: HealthCheck) -> list[Self]:
        """A node's answer taken into the ring; the clients of nodes no longer listed
        (the caller closes them)."""
        ring = self.ring
        assert ring is not None
        if via is self and "," not in self.address and health.advertise_address:
            self._seed_name = health.advertise_address
        names = [p.grpc_address for p in (*health.local_peers, *health.region_peers)]
        ring.learn(names)
        with self._nodes_lock:
            gone = [n for n in self._nodes if n not in ring.nodes]
            removed = [self._nodes.pop(n) for n in gone]
        return [node for node in removed if node is not self]


class Client(_Base[HttpTransport]):
    """Blocking client; one gRPC channel (and, given ``http_address``, a pool of HTTP/1.1
    connections), safe to share between threads.

    ``http_address``: the node's HTTP gateway (``--http-address``), ``host:port``; lone
    checks go there unless ``transport="grpc"``. ``ssl_context``: for a gateway on TLS
    (required with ``credentials``), e.g. ``ssl.create_default_context(cafile=ca)`` with
    ``load_cert_chain`` when the node asks for client certificates.

    ``route``: send each check to its owner (default; off with an ``http_address``);
    ``ring_refresh``: seconds between two reads of the node list; ``ring_hash`` and
    ``ring_replicas``: the nodes' ``--peer-picker-hash`` and replicas, if known (else
    the hash is learned from the answers). One more channel per node, opened on first
    use; a batch's parts go out on up to 8 threads."""

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        *,
        timeout: float = 5.0,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        coalesce: bool = True,
        native: bool | None = None,
        http_address: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        transport: Transport = "auto",
        route: bool = True,
        ring_refresh: float = REFRESH,
        ring_hash: str = "fnv1a-mix",
        ring_replicas: int = DEFAULT_REPLICAS,
    ) -> None:
        http = (HttpTransport, http_address, ssl_context, transport)
        super().__init__(address, timeout, credentials, options, native, http)
        self._channel: grpc.Channel | None = self._grpcio_channel(
            grpc.insecure_channel, grpc.secure_channel
        )
        self._stub: Any = self._channel and pb_grpc.V1Stub(self._channel)
        lone = self._one if self.http is None else self._one_http
        self.coalescer: Coalescer | NativeCoalescer | None = None
        """Concurrent ``check`` calls of this client's threads go in one GetRateLimits:
        inside the native channel when every check goes there (see NativeCoalescer),
        else in Python."""
        if coalesce and self._native is not None and self.http is None:
            self.coalescer = NativeCoalescer(self._check_native, self._native)
        elif coalesce:
            self.coalescer = Coalescer(self._get, lone)
        self._route(None if self.coalescer is None else self.coalescer.check, lone)
        node_args = {"timeout": timeout, "credentials": credentials, "options": options,
                     "coalesce": coalesce, "native": native}  # fmt: skip
        self._routing(route, (ring_refresh, ring_hash, ring_replicas), node_args)
        self._pool: ThreadPoolExecutor | None = None
        """Sends the parts of a batch owned by different nodes in parallel."""
        self._refresher: threading.Thread | None = None

    def get_rate_limits(
        self, requests: Sequence[RateLimitRequest], *, timeout: float | None = None
    ) -> list[RateLimitResponse]:
        """One response per request, in order; per-item errors are in ``error``. Each
        owner's part goes to it, the parts in parallel."""
        if self.ring is None:
            return self._get(requests, timeout)
        return self._routed_batch(requests, timeout, _ATTEMPTS)

    def _routed_batch(
        self, requests: Sequence[RateLimitRequest], timeout: float | None, attempts: int
    ) -> list[RateLimitResponse]:
        ring = self.ring
        assert ring is not None
        if ring.due():
            self._refresh_due()
        groups = _plan(ring, requests)
        if len(groups) == 1:
            return self._group(next(iter(groups)), requests, timeout, attempts)
        parts = [(owner, [requests[i] for i in idx]) for owner, idx in groups.items()]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(8, thread_name_prefix="smockron-client")
        pending = [self._pool.submit(self._group, o, p, timeout, attempts) for o, p in parts[1:]]
        answers = [self._group(*parts[0], timeout, attempts)]
        answers.extend(f.result() for f in pending)
        return _merge(len(requests), groups.values(), answers)

    def _group(
        self,
        owner: str | None,
        requests: Sequence[RateLimitRequest],
        timeout: float | None,
        attempts: int,
    ) -> list[RateLimitResponse]:
        """Requests of one owner to it; if it cannot be reached, to their next owners."""
        ring = self.ring
        if owner is None or ring is None:
            return self._get(requests, timeout)
        try:
            got = self._node(owner)._get(requests, timeout)
        except ClientUnavailable:
            if attempts <= 1:
                raise
            ring.mark_down(owner)
            return self._routed_batch(requests, timeout, attempts - 1)
        ring.observe(requests[0].hash_key, owner, got[0].metadata.get("owner"))
        return got

    def _routed(self, request: RateLimitRequest, timeout: float | None) -> RateLimitResponse:
        """A check sent to its owner; if it cannot be reached, to the next one."""
        ring = self.ring
        assert ring is not None
        if ring.due():
            self._refresh_due()
        key = request.hash_key
        for _ in range(_ATTEMPTS - 1):
            owner = ring.owner(key)
            if owner is None:
                break
            node = self._nodes.get(owner) or self._node(owner)
            try:
                resp: RateLimitResponse = node._via(timeout)(request)
            except ClientUnavailable:
                ring.mark_down(owner)
                continue
            if resp.metadata.get("owner", owner) != owner:
                ring.observe(key, owner, resp.metadata["owner"])
            return resp
        last: RateLimitResponse = self._via(timeout)(request)
        return last

    def _refresh_due(self) -> None:
        """The first time, read the node list on this thread; later on a thread of its
        own, so that no check waits for a HealthCheck."""
        if self.ring is None or not self.ring.learned:
            self._refresh()
        elif self._refresher is None or not self._refresher.is_alive():
            self._refresher = threading.Thread(
                target=self._refresh, name="smockron-client-ring", daemon=True
            )
            self._refresher.start()

    def _refresh(self) -> None:
        """Re-read the node list (one thread at a time; the others go on meanwhile)."""
        ring = self.ring
        if ring is None or not ring.claim():
            return
        learned = False
        try:
            wait = min(self.timeout, _HEALTH_TIMEOUT)
            for node in self._nodes_to_ask():
                with contextlib.suppress(ClientError):
                    health = node.health_check(timeout=wait)
                    for gone in self._took(node, health):
                        gone.close()
                    learned = True
                    break
        finally:
            if not learned:
                ring.failed()

    def _get(
        self, requests: Sequence[RateLimitRequest], timeout: float | None = None
    ) -> list[RateLimitResponse]:
        """get_rate_limits on ``address`` alone."""
        out: list[RateLimitResponse] = []
        if self._batches_over_http:
            for i in range(0, len(requests), MAX_BATCH_SIZE):
                out.extend(self._post(requests[i : i + MAX_BATCH_SIZE], timeout))
            return out
        for batch in _batches(requests):
            got = self._invoke("GetRateLimits", batch, pb.GetRateLimitsResp, timeout)
            out.extend(_responses(batch, got, self.address))
        return out

    def _one(self, request: RateLimitRequest, timeout: float | None = None) -> RateLimitResponse:
        """get_rate_limits for a single request over gRPC, without the list machinery."""
        batch = _batches((request,))[0]
        got = self._invoke("GetRateLimits", batch, pb.GetRateLimitsResp, timeout)
        return _single(batch, got, self.address)

    def _one_http(
        self, request: RateLimitRequest, timeout: float | None = None
    ) -> RateLimitResponse:
        return self._post((request,), timeout)[0]

    def _check_native(self, r: RateLimitRequest) -> RateLimitResponse:
        """One check coalesced inside the native channel, which encodes the request's
        fields and decodes the answer's (no protobuf objects in Python)."""
        try:
            status, limit, remaining, reset_time, error, metadata = self._native.check(
                _GET_RATE_LIMITS, self.timeout, r.name, r.unique_key, r.hits, r.limit,
                r.duration, r.algorithm, r.behavior, r.burst, r.metadata or None, r.created_at,
            )  # fmt: skip
        except _CallError as exc:
            raise _coded_error(exc, self.address, "GetRateLimits") from exc
        status = Status.OVER_LIMIT if status == pb.OVER_LIMIT else Status.UNDER_LIMIT
        return RateLimitResponse(status, limit, remaining, reset_time, error, metadata)

    def _post(
        self, requests: Sequence[RateLimitRequest], timeout: float | None
    ) -> list[RateLimitResponse]:
        """GetRateLimits (at most 1,000 requests) over the HTTP gateway."""
        http = self.http
        assert http is not None
        try:
            body = http.post(_HTTP_PATH, encode_requests(requests),
                             self._deadline(timeout))  # fmt: skip
            return decode_responses(body, len(requests))
        except CallError as exc:
            raise _coded_error(exc, http.address, "GetRateLimits") from exc

    def _invoke(self, method: str, request: Any, answer: Any, timeout: float | None) -> Any:
        """One unary call of V1 ``method``; the ``answer`` message, or a ClientError."""
        deadline = self._deadline(timeout)
        try:
            if self._native is not None:
                raw = self._native.call(_PATH + method, request.SerializeToString(), deadline)
                return answer.FromString(raw)
            return getattr(self._stub, method)(request, timeout=deadline)
        except grpc.RpcError as exc:
            raise _error(exc, self.address, method) from exc
        except _CallError as exc:
            raise _coded_error(exc, self.address, method) from exc

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
        if self.ring is None:
            return _checked(self._via(timeout)(req), name, key)
        return _checked(self._routed(req, timeout), name, key)

    def health_check(self, *, timeout: float | None = None) -> HealthCheck:
        req = pb.HealthCheckReq()
        return _health(self._invoke("HealthCheck", req, pb.HealthCheckResp, timeout))

    def live_check(self, *, timeout: float | None = None) -> None:
        """Returns if the server process answers at all (Gubernator's LiveCheck)."""
        self._invoke("LiveCheck", pb.LiveCheckReq(), pb.LiveCheckResp, timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for node in list(self._nodes.values()):
            if node is not self:
                node.close()
        if self._native is not None:
            self._native.close()
        if self._channel is not None:
            self._channel.close()
        if self.http is not None:
            self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient(_Base[AsyncHttpTransport]):
    """asyncio client; create and use it inside one event loop. On the native channel a
    call's end reaches the loop through an eventfd it watches (no thread per call); on
    grpcio it is a ``grpc.aio`` channel. ``http_address``, ``ssl_context`` and
    ``transport`` as for ``Client``: lone checks then go over HTTP/1.1 connections kept
    alive on the loop (``AsyncHttpTransport``)."""

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        *,
        timeout: float = 5.0,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        coalesce: bool = True,
        native: bool | None = None,
        http_address: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        transport: Transport = "auto",
        route: bool = True,
        ring_refresh: float = REFRESH,
        ring_hash: str = "fnv1a-mix",
        ring_replicas: int = DEFAULT_REPLICAS,
    ) -> None:
        http = (AsyncHttpTransport, http_address, ssl_context, transport)
        super().__init__(address, timeout, credentials, options, native, http)
        self._channel: grpc.aio.Channel | None = self._grpcio_channel(
            grpc.aio.insecure_channel, grpc.aio.secure_channel
        )
        self._stub: Any = self._channel and pb_grpc.V1Stub(self._channel)
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop watching the native channel's completions (set by the first call)."""
        self._waiting: set[asyncio.Future[tuple[int, bytes | None, str]]] = set()
        lone = self._one if self.http is None else self._one_http
        self.coalescer = AsyncCoalescer(self._get, lone) if coalesce else None
        """Concurrent ``check`` calls on this client's loop go in one GetRateLimits."""
        self._route(None if self.coalescer is None else self.coalescer.check, lone)
        node_args = {"timeout": timeout, "credentials": credentials, "options": options,
                     "coalesce": coalesce, "native": native}  # fmt: skip
        self._routing(route, (ring_refresh, ring_hash, ring_replicas), node_args)
        self._refreshing: asyncio.Task[None] | None = None

    async def get_rate_limits(
        self, requests: Sequence[RateLimitRequest], *, timeout: float | None = None
    ) -> list[RateLimitResponse]:
        """One response per request, in order; each owner's part goes to it, the parts
        (and batches of 1,000) concurrently."""
        if self.ring is None:
            return await self._get(requests, timeout)
        return await self._routed_batch(requests, timeout, _ATTEMPTS)

    async def _routed_batch(
        self, requests: Sequence[RateLimitRequest], timeout: float | None, attempts: int
    ) -> list[RateLimitResponse]:
        ring = self.ring
        assert ring is not None
        if ring.due():
            await self._refresh_due()
        groups = _plan(ring, requests)
        if len(groups) == 1:
            return await self._group(next(iter(groups)), requests, timeout, attempts)
        answers = await asyncio.gather(
            *(
                self._group(owner, [requests[i] for i in idx], timeout, attempts)
                for owner, idx in groups.items()
            )
        )
        return _merge(len(requests), groups.values(), answers)

    async def _group(
        self,
        owner: str | None,
        requests: Sequence[RateLimitRequest],
        timeout: float | None,
        attempts: int,
    ) -> list[RateLimitResponse]:
        """As the sync client's ``_group``."""
        ring = self.ring
        if owner is None or ring is None:
            return await self._get(requests, timeout)
        try:
            got = await self._node(owner)._get(requests, timeout)
        except ClientUnavailable:
            if attempts <= 1:
                raise
            ring.mark_down(owner)
            return await self._routed_batch(requests, timeout, attempts - 1)
        ring.observe(requests[0].hash_key, owner, got[0].metadata.get("owner"))
        return got

    async def _routed(self, request: RateLimitRequest, timeout: float | None) -> RateLimitResponse:
        """As the sync client's ``_routed``."""
        ring = self.ring
        assert ring is not None
        if ring.due():
            await self._refresh_due()
        key = request.hash_key
        for _ in range(_ATTEMPTS - 1):
            owner = ring.owner(key)
            if owner is None:
                break
            node = self._nodes.get(owner) or self._node(owner)
            try:
                resp: RateLimitResponse = await node._via(timeout)(request)
            except ClientUnavailable:
                ring.mark_down(owner)
                continue
            if resp.metadata.get("owner", owner) != owner:
                ring.observe(key, owner, resp.metadata["owner"])
            return resp
        last: RateLimitResponse = await self._via(timeout)(request)
        return last

    async def _refresh_due(self) -> None:
        """The first time, wait for the node list; later re-read it in the background."""
        ring = self.ring
        assert ring is not None
        if not ring.learned:
            await self._refresh()
        elif self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        ring = self.ring
        if ring is None or not ring.claim():
            return
        learned = False
        try:
            wait = min(self.timeout, _HEALTH_TIMEOUT)
            for node in self._nodes_to_ask():
                with contextlib.suppress(ClientError):
                    health = await node.health_check(timeout=wait)
                    for gone in self._took(node, health):
                        await gone.close()
                    learned = True
                    break
        finally:
            if not learned:
                ring.failed()

    async def _get(
        self, requests: Sequence[RateLimitRequest], timeout: float | None = None
    ) -> list[RateLimitResponse]:
        """get_rate_limits on ``address`` alone; batches of 1,000 sent concurrently."""
        if self._batches_over_http:
            if len(requests) <= MAX_BATCH_SIZE:
                return await self._post(requests, timeout)
            n = MAX_BATCH_SIZE
            parts = await asyncio.gather(
                *(self._post(requests[i : i + n], timeout) for i in range(0, len(requests), n))
            )
            return [resp for part in parts for resp in part]
        batches = _batches(requests)
        if len(batches) == 1:  # the common case needs no tasks (gather makes one each)
            return await self._call(batches[0], timeout)
        answers = await asyncio.gather(*(self._call(b, timeout) for b in batches))
        return [resp for answer in answers for resp in answer]

    async def _one(
        self, request: RateLimitRequest, timeout: float | None = None
    ) -> RateLimitResponse:
        """get_rate_limits for a single request, as the sync client's ``_one``. On the
        native channel the item is encoded and its answer decoded by the channel's codec
        (no protobuf objects), as the sync client's coalesced checks are."""
        if self._native is None:
            batch = _batches((request,))[0]
            got = await self._invoke("GetRateLimits", batch, pb.GetRateLimitsResp, timeout)
            return _single(batch, got, self.address)
        r = request
        item = _nativeclient.encode_request(
            r.name, r.unique_key, r.hits, r.limit, r.duration, r.algorithm, r.behavior,
            r.burst, r.metadata or None, r.created_at,
        )  # fmt: skip
        raw = await self._raw("GetRateLimits", _field1(item), timeout)
        answer = _only_field1(raw)
        if answer is None:  # not one answer in the plain form: the generated classes judge
            return _single(_batches((request,))[0], pb.GetRateLimitsResp.FromString(raw),
                           self.address)  # fmt: skip
        status, limit, remaining, reset_time, error, metadata = _nativeclient.decode_response(
            answer
        )
        status = Status.OVER_LIMIT if status == pb.OVER_LIMIT else Status.UNDER_LIMIT
        return RateLimitResponse(status, limit, remaining, reset_time, error, metadata)

    async def _one_http(
        self, request: RateLimitRequest, timeout: float | None = None
    ) -> RateLimitResponse:
        return (await self._post((request,), timeout))[0]

    async def _post(
        self, requests: Sequence[RateLimitRequest], timeout: float | None
    ) -> list[RateLimitResponse]:
        """GetRateLimits (at most 1,000 requests) over the HTTP gateway."""
        http = self.http
        assert http is not None
        try:
            body = await http.post(_HTTP_PATH, encode_requests(requests),
                                   self._deadline(timeout))  # fmt: skip
            return decode_responses(body, len(requests))
        except CallError as exc:
            raise _coded_error(exc, http.address, "GetRateLimits") from exc

    async def _call(
        self, batch: pb.GetRateLimitsReq, timeout: float | None
    ) -> list[RateLimitResponse]:
        got = await self._invoke("GetRateLimits", batch, pb.GetRateLimitsResp, timeout)
        return _responses(batch, got, self.address)

    async def _invoke(self, method: str, request: Any, answer: Any, timeout: float | None) -> Any:
        """One unary call of V1 ``method``; the ``answer`` message, or a ClientError."""
        deadline = self._deadline(timeout)
        if self._native is None:
            try:
                return await getattr(self._stub, method)(request, timeout=deadline)
            except grpc.RpcError as exc:
                raise _error(exc, self.address, method) from exc
        return answer.FromString(await self._raw(method, request.SerializeToString(), timeout))

    async def _raw(self, method: str, payload: bytes, timeout: float | None) -> bytes:
        """One unary call of V1 ``method`` on the native channel, on bytes."""
        future = self._watch().create_future()
        try:
            self._native.start(_PATH + method, payload, self._deadline(timeout), future)
        except _CallError as exc:
            raise _coded_error(exc, self.address, method) from exc
        self._waiting.add(future)
        try:
            code, raw, details = await future
        finally:
            self._waiting.discard(future)
        if raw is None:
            raise _status_error(_CODES.get(code, grpc.StatusCode.UNKNOWN), details,
                                self.address, method)  # fmt: skip
        return bytes(raw)

    def _watch(self) -> asyncio.AbstractEventLoop:
        """The running loop, reading the native channel's completions from now on."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._native.fileno(), self._deliver)
        return self._loop

    def _deliver(self) -> None:
        """Each finished native call's outcome to its future (unless cancelled)."""
        for future, code, raw, details in self._native.completions():
            if not future.done():
                future.set_result((code, raw, details))

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
        if self.ring is None:
            return _checked(await self._via(timeout)(req), name, key)
        return _checked(await self._routed(req, timeout), name, key)

    async def health_check(self, *, timeout: float | None = None) -> HealthCheck:
        req = pb.HealthCheckReq()
        return _health(await self._invoke("HealthCheck", req, pb.HealthCheckResp, timeout))

    async def live_check(self, *, timeout: float | None = None) -> None:
        await self._invoke("LiveCheck", pb.LiveCheckReq(), pb.LiveCheckResp, timeout)

    async def close(self) -> None:
        """Calls still in flight are cancelled, as grpc.aio does."""
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refreshing
        for node in list(self._nodes.values()):
            if node is not self:
                await node.close()
        if self._native is not None:
            self._native.close()
            if self._loop is not None:
                self._loop.remove_reader(self._native.fileno())
            for future in list(self._waiting):
                future.cancel()
        if self._channel is not None:
            await self._channel.close(grace=None)
        if self.http is not None:
            self.http.close()

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
