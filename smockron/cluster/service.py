"""The gRPC fronts: V1 for clients, PeersV1 for other nodes, both calling one Node.

gRPC only: the servicers, the lenient deserializers and the handler tables the three
servers take (see transports.py). What a call means is decided in api.py.

PeersV1 trusts its caller (UpdatePeerGlobals installs whatever GLOBAL state it is told),
so by default it is served on the node's peer listener only; on the client port its
methods are refused with PERMISSION_DENIED, counted and logged (rate-limited, escaped).
``add_to_server(..., peers=True)`` serves it on the client port too, as Gubernator does,
for clusters that mix Gubernator and smockron nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from smockron.cluster import convert
from smockron.cluster.api import (
    PEER_TOO_MANY,
    TOO_MANY,
    answer,
    answer_here,
    forward_now,
    health_pb,
)
from smockron.cluster.node import MAX_BATCH, Node
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import peers_pb2
from smockron.cluster.transports import GrpcServer, ThreadedTransport
from smockron.cluster.transports.threaded import Deferred, fast_or_bridged, keep_none
from smockron.ratelog import RateLimitedLog

M = TypeVar("M", bound=Message)
log = logging.getLogger("smockron.cluster.grpc")
_bad_log = RateLimitedLog(log, interval=1.0)
_refused_log = RateLimitedLog(log, interval=1.0)
PEER_METHODS = ("GetPeerRateLimits", "UpdatePeerGlobals")


class V1Servicer:
    """pb.gubernator.V1 for clients."""

    def __init__(self, node: Node) -> None:
        self._node = node

    async def GetRateLimits(
        self, request: pb.GetRateLimitsReq, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetRateLimitsResp:
        items = await _items(self._node, request, context, "GetRateLimits", TOO_MANY)
        return pb.GetRateLimitsResp(responses=await answer(self._node, items))

    async def HealthCheck(
        self, request: pb.HealthCheckReq, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.HealthCheckResp:
        return health_pb(self._node)

    async def LiveCheck(
        self, request: pb.LiveCheckReq, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LiveCheckResp:
        return pb.LiveCheckResp()


class PeersV1Servicer:
    """pb.gubernator.PeersV1 for other nodes."""

    def __init__(self, node: Node) -> None:
        self._node = node

    async def GetPeerRateLimits(
        self, request: peers_pb2.GetPeerRateLimitsReq, context: grpc.aio.ServicerContext[Any, Any]
    ) -> peers_pb2.GetPeerRateLimitsResp:
        items = await _items(self._node, request, context, "GetPeerRateLimits", PEER_TOO_MANY)
        resps = await answer(self._node, items, peer=True)
        return peers_pb2.GetPeerRateLimitsResp(rate_limits=resps)

    async def UpdatePeerGlobals(
        self, request: peers_pb2.UpdatePeerGlobalsReq, context: grpc.aio.ServicerContext[Any, Any]
    ) -> peers_pb2.UpdatePeerGlobalsResp:
        if request is None:
            await _reject(self._node, context, "UpdatePeerGlobals")
        self._node.update_globals(
            (g.key, convert.response_from_pb(g.status), g.algorithm, g.duration)
            for g in request.globals
        )
        return peers_pb2.UpdatePeerGlobalsResp()


async def _items(
    node: Node,
    request: pb.GetRateLimitsReq | peers_pb2.GetPeerRateLimitsReq | None,
    context: grpc.aio.ServicerContext[Any, Any],
    method: str,
    too_many: str,
) -> Sequence[pb.RateLimitReq]:
    """The items of a check call; a call that did not decode, or has too many, is
    aborted (``context.abort`` raises)."""
    if request is None:
        await _reject(node, context, method)
        raise AssertionError("unreachable: abort raises")
    if len(request.requests) > MAX_BATCH:
        node.metrics.check_errors.labels("Request too large").inc()
        await context.abort(grpc.StatusCode.OUT_OF_RANGE, too_many)
    return request.requests


async def _reject(node: Node, context: grpc.aio.ServicerContext[Any, Any], method: str) -> None:
    node.metrics.grpc_malformed.labels(method).inc()
    peer = context.peer()
    _bad_log.warning("%s from %s: request bytes do not decode", method, peer)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {method} request")


def _lenient(message: type[M]) -> Callable[[bytes], M | None]:
    """A deserializer that yields None for bad bytes, so the servicer counts and rejects them
    (grpc's own path logs a traceback per call)."""

    def parse(data: bytes) -> M | None:
        try:
            return message.FromString(data)
        except DecodeError:
            return None

    return parse


def _handler(
    method: Callable[..., Any],
    request: type[Message],
    response: type[Message],
    *,
    threaded: bool = False,
) -> grpc.RpcMethodHandler[Any, Any]:
    parse = _lenient(request)
    return grpc.unary_unary_rpc_method_handler(
        method,
        request_deserializer=keep_none(parse) if threaded else parse,
        response_serializer=response.SerializeToString,
    )


Guard: TypeAlias = "Callable[[grpc.GenericRpcHandler[Any, Any]], grpc.GenericRpcHandler[Any, Any]]"
"""Wraps PeersV1's handler on the peer listener (peergate.MemberGate.guard)."""


def add_threaded_fast_paths(
    server: ThreadedTransport,
    node: Node,
    *,
    client: bool = True,
    peers: bool = True,
    guard: Guard | None = None,
) -> None:
    """On the threaded server: GetRateLimits (``client``) and GetPeerRateLimits
    (``peers``) calls that this node decides alone, and LiveCheck, are answered on the
    gRPC thread; the other calls of those two methods go to the asyncio servicers on the
    event loop. Register before ``add_to_server`` / ``add_peer_service``."""

    defers = getattr(server, "defers", False)
    """The server finishes a call later (the native one): forwards need no gRPC thread."""
    client_checks = _client_fast_path(node, defers)
    peer_checks = _peer_fast_path(node)
    get_rate_limits = fast_or_bridged(client_checks, V1Servicer(node).GetRateLimits, server.loop)
    get_peer_rate_limits = fast_or_bridged(
        peer_checks, PeersV1Servicer(node).GetPeerRateLimits, server.loop
    )

    v1 = {"LiveCheck": _handler(_live_check, pb.LiveCheckReq, pb.LiveCheckResp, threaded=True)}
    if client:
        v1["GetRateLimits"] = _handler(
            get_rate_limits, pb.GetRateLimitsReq, pb.GetRateLimitsResp, threaded=True
        )
    handlers = [grpc.method_handlers_generic_handler("pb.gubernator.V1", v1)]
    if peers:
        peer_methods = {
            "GetPeerRateLimits": _handler(
                get_peer_rate_limits,
                peers_pb2.GetPeerRateLimitsReq,
                peers_pb2.GetPeerRateLimitsResp,
                threaded=True,
            )
        }
        peer = grpc.method_handlers_generic_handler("pb.gubernator.PeersV1", peer_methods)
        handlers.append((guard or _same)(peer))
    server.add_threaded_handlers(handlers)


def _client_fast_path(
    node: Node, defers: bool
) -> Callable[[pb.GetRateLimitsReq, Any], pb.GetRateLimitsResp | Deferred | None]:
    """GetRateLimits on the gRPC thread: forwarded at once (``defers``: the server
    finishes the call later) or answered here; None: the event loop's servicer answers."""

    def client_checks(
        request: pb.GetRateLimitsReq, context: Any
    ) -> pb.GetRateLimitsResp | Deferred | None:
        if len(request.requests) <= MAX_BATCH:
            # a call for another node is recognised before anything is decoded
            forwarded = forward_now(node, request, context.call) if defers else None
            if forwarded is not None:
                return Deferred(forwarded)
            resp = pb.GetRateLimitsResp()
            if answer_here(node, request.requests, resp.responses):
                return resp
        return None

    return client_checks


def _peer_fast_path(
    node: Node,
) -> Callable[[peers_pb2.GetPeerRateLimitsReq, Any], peers_pb2.GetPeerRateLimitsResp | None]:
    """GetPeerRateLimits answered on the gRPC thread, or None (the event loop's)."""

    def peer_checks(
        request: peers_pb2.GetPeerRateLimitsReq, context: Any
    ) -> peers_pb2.GetPeerRateLimitsResp | None:
        if len(request.requests) <= MAX_BATCH:
            resp = peers_pb2.GetPeerRateLimitsResp()
            if answer_here(node, request.requests, resp.rate_limits, peer=True):
                return resp
        return None

    return peer_checks


def _live_check(request: pb.LiveCheckReq, context: grpc.ServicerContext) -> pb.LiveCheckResp:
    return pb.LiveCheckResp()


def add_to_server(
    server: GrpcServer, node: Node, *, peers: bool = True, guard: Guard | None = None
) -> None:
    """The client port: V1, and PeersV1 when ``peers`` (behind ``guard``; else its
    methods are refused: ``refuse_peer_calls``). Registered by hand (same names as the
    generated helpers)."""
    v1 = V1Servicer(node)
    v1_methods = {
        "GetRateLimits": _handler(v1.GetRateLimits, pb.GetRateLimitsReq, pb.GetRateLimitsResp),
        "HealthCheck": _handler(v1.HealthCheck, pb.HealthCheckReq, pb.HealthCheckResp),
        "LiveCheck": _handler(v1.LiveCheck, pb.LiveCheckReq, pb.LiveCheckResp),
    }
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler("pb.gubernator.V1", v1_methods),
            (guard or _same)(_peer_handler(node)) if peers else _refusing_handler(node),
        )
    )


def add_peer_service(server: GrpcServer, node: Node, guard: Guard | None = None) -> None:
    """The peer listener: PeersV1 (behind ``guard``), and V1's LiveCheck and
    HealthCheck (peers probe LiveCheck on the address they call)."""
    v1 = V1Servicer(node)
    v1_methods = {
        "HealthCheck": _handler(v1.HealthCheck, pb.HealthCheckReq, pb.HealthCheckResp),
        "LiveCheck": _handler(v1.LiveCheck, pb.LiveCheckReq, pb.LiveCheckResp),
    }
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler("pb.gubernator.V1", v1_methods),
            (guard or _same)(_peer_handler(node)),
        )
    )


def _same(handler: grpc.GenericRpcHandler[Any, Any]) -> grpc.GenericRpcHandler[Any, Any]:
    return handler


def _refusing_handler(node: Node) -> grpc.GenericRpcHandler[Any, Any]:
    """PeersV1 on the client port: PERMISSION_DENIED, counted, one log line a second."""

    def refuse(method: str) -> Callable[..., Any]:
        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            node.metrics.peer_calls_refused.labels(method).inc()
            _refused_log.warning(
                "PeersV1 %s from %s refused: PeersV1 is served on the peer listener only",
                method,
                context.peer(),
            )
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "PeersV1 is not served on this port (node-to-node calls go to the peer listener)",
            )

        return call

    methods = {
        name: grpc.unary_unary_rpc_method_handler(
            refuse(name), request_deserializer=_ignore, response_serializer=None
        )
        for name in PEER_METHODS
    }
    return grpc.method_handlers_generic_handler("pb.gubernator.PeersV1", methods)


def _ignore(data: bytes) -> bytes:
    """A refused call's request is not parsed at all."""
    return b""


def _peer_handler(node: Node) -> grpc.GenericRpcHandler[Any, Any]:
    peers = PeersV1Servicer(node)
    peer_methods = {
        "GetPeerRateLimits": _handler(
            peers.GetPeerRateLimits,
            peers_pb2.GetPeerRateLimitsReq,
            peers_pb2.GetPeerRateLimitsResp,
        ),
        "UpdatePeerGlobals": _handler(
            peers.UpdatePeerGlobals,
            peers_pb2.UpdatePeerGlobalsReq,
            peers_pb2.UpdatePeerGlobalsResp,
        ),
    }
    return grpc.method_handlers_generic_handler("pb.gubernator.PeersV1", peer_methods)
