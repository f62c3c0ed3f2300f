"""The three gRPC servers a node can run, behind one typed interface.

- ``asyncio``: ``grpc.aio.server``, every call a coroutine on the node's event loop;
- ``threads``: :class:`~smockron.cluster.transports.threaded.ThreadedServer`, ``grpc.server`` whose
  threads answer what this node decides alone and bridge the rest to the loop;
- ``native``: :class:`~smockron.cluster.transports.native.NativeServer`, libgrpc++ carrying the
  calls to the same handlers as ``threads`` (falls back to ``threads`` when not built).

:class:`GrpcServer` is what every one of them offers (and all ``ClusterServer`` uses);
:class:`ThreadedTransport` is what the two threaded ones add: handlers run on a gRPC
thread, and the loop their slow calls are bridged to.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeAlias

import grpc

from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.tls import ClientSanCheck
from smockron.cluster.transports import native
from smockron.cluster.transports.native import NativeServer
from smockron.cluster.transports.threaded import ThreadedServer

log = logging.getLogger("smockron.cluster")

Handler: TypeAlias = "grpc.GenericRpcHandler[Any, Any]"


class GrpcServer(Protocol):
    """What ``ClusterServer`` needs from any of the three servers."""

    def add_generic_rpc_handlers(self, handlers: Sequence[Handler]) -> None: ...

    def add_insecure_port(self, address: str) -> int: ...

    async def start(self) -> None: ...

    async def stop(self, grace: float | None) -> None: ...


class ThreadedTransport(GrpcServer, Protocol):
    """A server whose gRPC threads can answer calls themselves (threads, native)."""

    loop: asyncio.AbstractEventLoop

    def add_threaded_handlers(self, handlers: Iterable[Handler]) -> None: ...


def make_grpc_server(
    kind: str,
    loop: asyncio.AbstractEventLoop,
    options: Sequence[tuple[str, Any]],
    metrics: ClusterMetrics,
    client_san: ClientSanCheck | None = None,
) -> tuple[GrpcServer, ThreadedTransport | None]:
    """The server ``kind`` names, and the same object when it is a threaded one;
    ``client_san`` checks client certificates (in the handshake, or on every call)."""
    if kind == "native" and not native.AVAILABLE:
        log.warning("gRPC server: native extension not built (no libgrpc++); using threads")
        kind = "threads"
    threaded: ThreadedTransport
    interceptor = client_san.interceptor(aio=kind == "asyncio") if client_san else None
    interceptors = [interceptor] if interceptor is not None else []
    if kind == "native":
        threaded = NativeServer(loop, options, metrics, client_san)
    elif kind == "threads":
        threaded = ThreadedServer(
            loop, options, unknown_method=metrics.unknown_method, interceptors=interceptors
        )
    else:
        return grpc.aio.server(options=options, interceptors=interceptors), None
    return threaded, threaded
