"""The native gRPC server: libgrpc++ (``_native.cc``) carrying calls, Python deciding them.

Why: the Python gRPC stack itself (``grpc.server``) costs more than twice the CPU per
unary call of a C++ server, and its tail latency under load is long before smockron does
any work (docs/benchmarks.md, "Single-check latency"). The
extension runs a libgrpc++ server with one generic service (raw bytes, no protobuf in
C++) and hands each call (method path, request bytes) to ``NativeServer._dispatch`` on a
gRPC thread, with the GIL held only for that.

The handlers are the ones the threaded server takes (``add_threaded_handlers`` for the
fast paths, ``add_generic_rpc_handlers`` for the asyncio servicers): a threaded handler
runs on the gRPC thread and answers at once; an asyncio handler is started on the node's
event loop and the call is finished from the loop thread when it is done, so no gRPC
thread waits on the loop. A fast path that falls back to its slow handler (``bridge`` in
threaded.py) gets a ``Deferred`` back instead of blocking, for the same reason.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import grpc

from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.tls import NATIVE_CLIENT_AUTH, CertDir, ClientSanCheck, TLSMaterial
from smockron.cluster.transports.threaded import MAX_METHODS, Deferred, bridge
from smockron.compiled import load
from smockron.errors import Aborted

_native: Any = load("_native")  # built only where libgrpc++ is installed (setup.py)

log = logging.getLogger("smockron.cluster")

AVAILABLE = _native is not None

_OK = grpc.StatusCode.OK.value[0]
_UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED.value[0]
_UNKNOWN = grpc.StatusCode.UNKNOWN.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]

_running: weakref.WeakSet[NativeServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """No gRPC thread may call into an interpreter that is finalizing."""
    for server in list(_running):
        server.shutdown_now()


class NativeContext:
    """The part of ``grpc.ServicerContext`` smockron's handlers use (abort, peer); a
    handler that needs more must be registered on another server kind."""

    __slots__ = ("_call",)
    defers = True
    """``bridge`` returns a ``Deferred`` here rather than block a gRPC thread."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)

    def peer(self) -> str:
        return str(self._call.peer)

    def is_active(self) -> bool:
        return not self._call.done

    @property
    def call(self) -> Any:
        """The extension's call object (``PeerClient.relay`` answers it)."""
        return self._call


# (deserializer, handler, serializer); an asyncio handler comes wrapped by ``bridge``
_Parse = Callable[[bytes], Any] | None
_Serialize = Callable[[Any], bytes] | None
_Entry = tuple[_Parse, Callable[..., Any], _Serialize]


class _Details:
    """The one thing ``GenericRpcHandler.service`` reads from its argument."""

    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[()] = ()


class NativeServer:
    """``ThreadedServer``'s interface over the libgrpc++ transport."""

    defers = True
    """A threaded handler may return a ``Deferred``: the call is finished when its
    future is done, and no gRPC thread waits meanwhile."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        options: Sequence[tuple[str, Any]] = (),
        metrics: ClusterMetrics | None = None,
        client_san: ClientSanCheck | None = None,
    ) -> None:
        """``client_san``: checked in the TLS handshake of every connection (``use_tls``)."""
        if _native is None:
            raise RuntimeError("smockron.cluster._native is not built (no libgrpc++)")
        self.loop = loop
        self._client_san = client_san
        self._unknown_method = (metrics or ClusterMetrics()).unknown_method
        self._options = list(options)
        self._threaded: list[grpc.GenericRpcHandler[Any, Any]] = []
        self._async: list[grpc.GenericRpcHandler[Any, Any]] = []
        self._cache: dict[str, _Entry | None] = {}
        self._server: Any = None
        self._tls: tuple[str, str, str | None, int, int, Any] | None = None
        self._certs: CertDir | None = None

    def use_tls(self, material: TLSMaterial) -> None:
        """Serve TLS on the port ``add_insecure_port`` binds (despite its name, which it
        keeps for ``ClusterServer``), every GUBER_TLS_CLIENT_AUTH mode exactly."""
        self._certs = CertDir()
        key, cert, ca = self._certs.write(material)
        check = self._client_san.verify if self._client_san is not None else None
        self._tls = (key, cert, ca, NATIVE_CLIENT_AUTH[material.client_auth], 1, check)

    def reload_tls(self, material: TLSMaterial) -> None:
        """libgrpc++ picks the new files up within a second."""
        if self._certs is not None:
            self._certs.write(material)

    def add_threaded_handlers(self, handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]) -> None:
        self._threaded.extend(handlers)

    def add_generic_rpc_handlers(
        self, handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        self._async.extend(handlers)

    def add_insecure_port(self, address: str) -> int:
        """Bind and start serving (handlers are registered by now); 0 if it cannot bind."""
        if self._server is not None:
            raise RuntimeError("the native server listens on one address")
        server = _native.Server(self._dispatch, address, self._options, self._tls)
        if server.port == 0:
            return 0
        self._server = server
        _running.add(self)
        return int(server.port)

    async def start(self) -> None:
        pass

    async def stop(self, grace: float | None) -> None:
        """Stop taking calls; wait (off the loop, which asyncio calls still need) for the
        ones in progress, at most ``grace`` seconds, then cancel the rest."""
        if self._certs is not None:
            self._certs.close()
        server = self._server
        if server is None:
            return
        await self.loop.run_in_executor(None, server.shutdown, grace or 0.0)
        _running.discard(self)

    def shutdown_now(self) -> None:
        if self._server is not None:
            self._server.shutdown(0.0)

    def stats(self) -> dict[str, int]:
        return dict(self._server.stats()) if self._server is not None else {}

    def _lookup(self, method: str) -> _Entry | None:
        details = _Details(method)
        for handlers, is_async in ((self._threaded, False), (self._async, True)):
            for generic in handlers:
                handler = generic.service(details)  # type: ignore[arg-type]
                if handler is None or handler.unary_unary is None:
                    continue
                fn = handler.unary_unary
                if is_async and inspect.iscoroutinefunction(fn):
                    fn = bridge(fn, self.loop)  # returns a Deferred on a NativeContext
                return (handler.request_deserializer, fn, handler.response_serializer)
        return None

    def _dispatch(self, call: Any, method: str, data: bytes) -> None:
        """Called by the extension on a gRPC thread for every call."""
        try:
            entry = self._cache[method]
        except KeyError:
            entry = self._lookup(method)
            if len(self._cache) < MAX_METHODS:
                self._cache[method] = entry
        if entry is None:
            self._unknown_method.inc()
            call.finish(_UNIMPLEMENTED, None, "Method not found!")
            return
        parse, handler, serialize = entry
        try:
            request = parse(data) if parse is not None else data
        except Exception:
            log.exception("%s: request deserializer failed", method)
            call.finish(_INTERNAL, None, "Exception deserializing request!")
            return
        try:
            response = handler(request, NativeContext(call))
        except Aborted as exc:
            call.finish(exc.code.value[0], None, exc.details)
            return
        except Exception as exc:
            log.exception("%s: handler failed", method)
            call.finish(_UNKNOWN, None, f"Exception calling application: {exc}")
            return
        if isinstance(response, Deferred):
            self._defer(call, response.future, serialize)
            return
        _answer(call, response, serialize)

    def _defer(
        self, call: Any, future: Future[Any], serialize: Callable[[Any], bytes] | None
    ) -> None:
        def done(future: Future[Any]) -> None:
            try:
                response = future.result()
            except Aborted as exc:
                call.finish(exc.code.value[0], None, exc.details)
            except Exception as exc:
                log.error("gRPC handler failed: %r", exc)
                call.finish(_UNKNOWN, None, f"Exception calling application: {exc}")
            else:
                _answer(call, response, serialize)

        future.add_done_callback(done)


def _answer(call: Any, response: Any, serialize: Callable[[Any], bytes] | None) -> None:
    try:
        body = serialize(response) if serialize is not None else response
    except Exception:
        log.exception("response serializer failed")
        call.finish(_INTERNAL, None, "Exception serializing response!")
        return
    call.finish(_OK, body, "")
