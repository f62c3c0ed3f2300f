"""What the sync and asyncio clients share: their arguments, checked once; the choice of
channel (native, grpcio) and of the HTTP gateway; where a check goes (coalesced or
alone); and the clients of the cluster's other nodes that routing sends to
(smockron.cluster.client._routing). Each twin adds only its way of waiting."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar, Generic, Self, TypeVar

import grpc

from smockron.cluster.client._channel import (
    DEFAULT_ADDRESS,
    Transport,
    coded_error,
    grpc_target,
    nativeclient,
    use_native,
)
from smockron.cluster.client._http import AsyncHttpTransport, HttpTransport
from smockron.cluster.client._httpcodec import CallError, decode_responses
from smockron.cluster.client._messages import HealthCheck
from smockron.cluster.client._routing import HEALTH_TIMEOUT, REFRESH, OwnerRing
from smockron.cluster.model import RateLimitRequest, RateLimitResponse
from smockron.core.hashring import DEFAULT_REPLICAS

_Http = TypeVar("_Http", HttpTransport, AsyncHttpTransport)


class BaseClient(Generic[_Http]):
    _http_class: ClassVar[Callable[..., Any]]
    """The HTTP transport of this twin (sync or asyncio)."""

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
        _check_arguments(timeout, credentials, http_address, ssl_context, transport)
        self.http: _Http | None = None
        """The HTTP/1.1 transport lone checks take, or None: they take gRPC."""
        if http_address and transport != "grpc":
            self.http = self._http_class(http_address, ssl_context=ssl_context)
        self._batches_over_http = transport == "http"
        self.address = grpc_target(address)
        self.timeout = timeout
        self._credentials = credentials
        # round_robin spreads calls over every address and routes around dead ones
        self._options = list(options)
        if not any(name == "grpc.lb_policy_name" for name, _ in self._options):
            self._options.append(("grpc.lb_policy_name", "round_robin"))
        self.native = use_native(native, credentials, self._options)
        """True: calls go through smockron.cluster._nativeclient; False: through grpcio."""
        self._native: Any = None
        if self.native:
            self._native = nativeclient.Channel(self.address, self._options)
        self._start(coalesce)
        node_args = {
            "timeout": timeout,
            "credentials": credentials,
            "options": options,
            "coalesce": coalesce,
            "native": native,
        }
        self._routing(route, (ring_refresh, ring_hash, ring_replicas), node_args)

    def _start(self, coalesce: bool) -> None:
        """The twin's own channel and coalescer; calls ``_route``."""
        raise NotImplementedError

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

    def _node(self, name: str | None) -> Self:
        """The client (unrouted) of the node ``name``: this one for the node at
        ``address`` (or None), else one made on first use."""
        if name is None:
            return self
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

    def _to_ask(self) -> list[Self] | None:
        """Where to ask for the node list, in order, if this caller is the one to ask
        now (``OwnerRing.claim``; it must then call ``_asked``), else None: ``address``
        first, then the nodes known and up (``address`` last when it is known to be
        down: no wait on it first)."""
        ring = self.ring
        if ring is None or not ring.claim():
            return None
        try:
            others: list[Self] = [self._node(n) for n in ring.nodes if n not in ring.down]
        except BaseException:
            ring.failed()
            raise
        others = [node for node in others if node is not self]
        return [*others, self] if self._seed_name in ring.down else [self, *others]

    @property
    def _health_wait(self) -> float:
        return min(self.timeout, HEALTH_TIMEOUT)

    def _asked(self, answer: tuple[Self, HealthCheck] | None) -> list[Self]:
        """The first node's answer taken into the ring (None: nobody answered, ask again
        soon); the clients of nodes no longer listed, for the caller to close."""
        ring = self.ring
        assert ring is not None
        if answer is None:
            ring.failed()
            return []
        via: Self = answer[0]
        health: HealthCheck = answer[1]
        if via is self and "," not in self.address and health.advertise_address:
            self._seed_name = health.advertise_address
        names = [p.grpc_address for p in (*health.local_peers, *health.region_peers)]
        ring.learn(names, seed=self._seed_name or self.address)
        with self._nodes_lock:
            gone = [n for n in self._nodes if n not in ring.nodes]
            removed = [self._nodes.pop(n) for n in gone]
        return [node for node in removed if node is not self]


def _check_arguments(
    timeout: float,
    credentials: grpc.ChannelCredentials | None,
    http_address: str | None,
    ssl_context: ssl.SSLContext | None,
    transport: Transport,
) -> None:
    if transport not in ("auto", "grpc", "http"):
        raise ValueError(f"transport must be auto, grpc or http, got {transport!r}")
    if transport == "http" and not http_address:
        raise ValueError("transport='http' needs the gateway's http_address")
    if http_address and credentials is not None and ssl_context is None:
        raise ValueError("the gateway is on TLS too: give ssl_context with credentials")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout}")


def decoded(body: bytes, count: int, address: str) -> list[RateLimitResponse]:
    """The HTTP gateway's answers to ``count`` requests (a ClientError if malformed)."""
    try:
        return decode_responses(body, count)
    except CallError as exc:
        raise coded_error(exc, address, "GetRateLimits") from exc
