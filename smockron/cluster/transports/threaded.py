"""The threaded gRPC server: ``grpc.server`` on a thread pool, fronting an asyncio node.

Why: a unary call through ``grpc.aio``'s server costs markedly more CPU (three asyncio
tasks and about ten event-loop iterations per call, plus the hops between gRPC's poller
thread and the loop) than ``grpc.server`` answering on its own threads
(docs/benchmarks.md, Cluster section). So calls that this node can
decide alone (client checks it owns, peer checks, LiveCheck) are answered on the gRPC
thread; everything else (forwarding, GLOBAL, HealthCheck, the Envoy front) keeps its
asyncio handler, which ``ThreadedServer`` runs on the node's event loop and waits for.

``ThreadedServer`` has the part of ``grpc.aio.Server``'s interface that ``ClusterServer``
and the extensions use, so the same ``add_to_server`` functions register on either.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from prometheus_client import Counter

from smockron.errors import Aborted

MAX_WORKERS = 128
"""Threads start only when no idle one is left (a handful at a node's usual rates); a call
bridged to the event loop holds its thread until answered, so this bounds such calls in
progress: 128 is far more than a node's CPU sustains at a 1 ms forward, and leaves room
for calls stuck on a dead peer until its timeout."""


Req = TypeVar("Req")
Resp = TypeVar("Resp")
UNDECODED: Any = object()
"""What ``keep_none`` turns a deserializer's None into: ``grpc.server`` fails a call whose
request deserializes to None with INTERNAL, before the handler could count and reject it
(``grpc.aio`` passes None on); ``bridge`` hands the asyncio handler None again."""


def keep_none(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserializer`` with None results replaced by UNDECODED."""
    if deserializer is None:
        return None
    parse = deserializer

    def call(data: bytes) -> Any:
        request = parse(data)
        return UNDECODED if request is None else request

    return call


class Deferred:
    """What ``bridge`` returns, instead of waiting, on a context that ``defers`` (the native
    server's): the caller finishes the call when ``future`` is done."""

    __slots__ = ("future",)

    def __init__(self, future: Future[Any]) -> None:
        self.future = future


class LoopContext:
    """The ``grpc.aio.ServicerContext`` surface an asyncio handler uses, over a threaded
    call's context: ``await abort(...)`` ends the handler; the rest is passed through."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def bridge(
    handler: Callable[[Any, Any], Any], loop: asyncio.AbstractEventLoop
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """A threaded unary handler that runs the asyncio ``handler`` on ``loop``."""

    def call(request: Any, context: grpc.ServicerContext) -> Any:
        if request is UNDECODED:
            request = None
        future = asyncio.run_coroutine_threadsafe(handler(request, LoopContext(context)), loop)
        if getattr(context, "defers", False):
            return Deferred(future)
        try:
            return future.result()
        except Aborted as exc:
            context.abort(exc.code, exc.details)  # raises, as grpc wants

    return call


def fast_or_bridged(
    fast: Callable[[Req, Any], Resp | None],
    handler: Callable[[Req, Any], Any],
    loop: asyncio.AbstractEventLoop,
) -> Callable[[Req, grpc.ServicerContext], Any]:
    """A threaded unary handler answering with ``fast(request, context)`` on the gRPC
    thread, or, when that returns None (or the request did not decode), with the
    asyncio ``handler`` on ``loop``."""
    slow = bridge(handler, loop)

    def call(request: Req, context: grpc.ServicerContext) -> Any:
        if request is not UNDECODED:
            response = fast(request, context)
            if response is not None:
                return response
        return slow(request, context)

    return call


MAX_METHODS = 1024
"""Methods whose handler a server keeps looked up (their names come from clients)."""


class AdaptedHandler(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """Serves ``inner``'s methods as ``adapt(method, handler)`` changes them, each
    method's handler adapted once and kept (at most :data:`MAX_METHODS`)."""

    def __init__(
        self, inner: grpc.GenericRpcHandler[Any, Any], adapt: Callable[[str, Any], Any]
    ) -> None:
        self._inner = inner
        self._adapt = adapt
        self._cache: dict[str, Any] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        if method in self._cache:
            return self._cache[method]
        handler = self._inner.service(handler_call_details)
        if handler is not None:
            handler = self._adapt(method, handler)
        if len(self._cache) < MAX_METHODS:
            self._cache[method] = handler
        return handler


def _bridged(
    inner: grpc.GenericRpcHandler[Any, Any], loop: asyncio.AbstractEventLoop
) -> AdaptedHandler:
    """Serves ``inner``'s methods, asyncio unary handlers bridged to the event loop."""

    def adapt(method: str, handler: Any) -> Any:
        if not inspect.iscoroutinefunction(handler.unary_unary):
            return handler
        return handler._replace(
            unary_unary=bridge(handler.unary_unary, loop),
            request_deserializer=keep_none(handler.request_deserializer),
        )

    return AdaptedHandler(inner, adapt)


class _CountUnknown(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """Registered last: a method no other handler serves is counted here (the server
    then answers UNIMPLEMENTED, as it would anyway)."""

    def __init__(self, counter: Counter | None) -> None:
        self._counter = counter

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> None:
        if self._counter is not None:
            self._counter.inc()


class ThreadedServer:
    """``grpc.server`` with a thread pool, taking the same handlers as ``grpc.aio``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        options: Sequence[tuple[str, Any]] = (),
        max_workers: int = MAX_WORKERS,
        unknown_method: Counter | None = None,
        interceptors: Sequence[grpc.ServerInterceptor[Any, Any]] = (),
    ) -> None:
        self.loop = loop
        self._unknown_method = unknown_method
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="smockron-grpc")
        self._server = grpc.server(self._pool, options=options, interceptors=list(interceptors))

    def add_generic_rpc_handlers(
        self, handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        self._server.add_generic_rpc_handlers(tuple(_bridged(h, self.loop) for h in handlers))

    def add_threaded_handlers(self, handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]) -> None:
        """Handlers that run on the gRPC thread as they are (register these first)."""
        self._server.add_generic_rpc_handlers(tuple(handlers))

    def add_insecure_port(self, address: str) -> int:
        return self._server.add_insecure_port(address)

    def add_secure_port(self, address: str, credentials: grpc.ServerCredentials) -> int:
        return self._server.add_secure_port(address, credentials)

    async def start(self) -> None:
        self._server.add_generic_rpc_handlers((_CountUnknown(self._unknown_method),))
        self._server.start()

    async def stop(self, grace: float | None) -> None:
        """Stop taking calls; wait (off the loop, which bridged calls still need) for
        the ones in progress, at most ``grace`` seconds."""
        done = self._server.stop(grace)
        await self.loop.run_in_executor(None, done.wait)
        self._pool.shutdown(wait=False)
