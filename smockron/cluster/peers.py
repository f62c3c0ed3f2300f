"""The client side of PeersV1: one PeerClient per other node, with its own batcher.

A PeerClient remembers recent errors (HealthCheck reports them, like Gubernator's
``GetLastErr``) and counts consecutive failures so the node can take a dead owner out
of the ring and answer locally instead of failing. The first successful call or probe
forgets the errors: a peer that is back makes the node healthy at once, not a minute
later.

A peer is named by its gRPC address (the ring, HealthCheck) and called at ``target``,
its PeersV1 listener (the gRPC address itself when PeersV1 shares the gRPC port).

Calls go through the native client channel (smockron.cluster._nativeclient, libgrpc++)
when it is built and the peers speak plain text: a forwarded check then costs the
forwarding node a fraction of a grpc.aio call's CPU (the channel's completions reach the
event loop through an eventfd it watches, as smockron.cluster.client's AsyncClient
does). With TLS, or without the extension, they go through grpc.aio.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from smockron.cluster import convert
from smockron.cluster.batching import Batcher
from smockron.cluster.model import RateLimitRequest, RateLimitResponse
from smockron.cluster.pb import gubernator_pb2, gubernator_pb2_grpc, peers_pb2, peers_pb2_grpc
from smockron.cluster.tls import TLSMaterial
from smockron.compiled import load
from smockron.ratelog import RateLimitedLog

_nativeclient: Any = load("_nativeclient")  # built only where libgrpc++ is installed

log = logging.getLogger("smockron.cluster.peers")

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # Fail fast and retry the connection soon: a restarted peer is back within a second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]
ERROR_MEMORY_S = 60.0
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
_PEERS = "/pb.gubernator.PeersV1/"
_LIVE_CHECK = "/pb.gubernator.V1/LiveCheck"
_GET_PEER = _PEERS + "GetPeerRateLimits"
RELAYS = 2
"""Calls started by ``relay`` in flight to one peer at most; more go batched."""


class PeerCallError(Exception):
    """A call on the native channel failed: ``code`` is the gRPC status code's name."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class _Relayed:
    """The token of a ``relay`` call: a completion the extension did not relay itself (a
    failure), delivered on the loop, goes to the caller's ``done``."""

    __slots__ = ("_done",)

    def __init__(self, done: Callable[[bytes | None], None]) -> None:
        self._done = done

    def done(self) -> bool:
        return False

    def set_result(self, outcome: tuple[int, bytes | None, str]) -> None:
        self._done(outcome[1])


class _NativeUnary:
    """Unary calls on the native channel, awaited on the running loop."""

    def __init__(self, target: str, options: list[tuple[str, Any]]) -> None:
        self.channel = _nativeclient.Channel(target, options)
        self.can_relay = hasattr(self.channel, "relay")
        """False with an extension built before ``relay`` existed: forwards go batched."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: set[asyncio.Future[tuple[int, bytes | None, str]]] = set()

    @property
    def watching(self) -> asyncio.AbstractEventLoop | None:
        """The loop that delivers completions, once a call on it started watching."""
        return self._loop

    async def call(self, method: str, request: Any, answer: Any, timeout: float) -> Any:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            loop.add_reader(self.channel.fileno(), self._deliver)
        future: asyncio.Future[tuple[int, bytes | None, str]] = loop.create_future()
        try:
            self.channel.start(method, request.SerializeToString(), timeout, future)
        except _nativeclient.CallError as exc:
            code, details = exc.args
            raise PeerCallError(_CODE_NAMES.get(code, "UNKNOWN"), details) from exc
        self._waiting.add(future)
        try:
            code, raw, details = await future
        finally:
            self._waiting.discard(future)
        if raw is None:
            raise PeerCallError(_CODE_NAMES.get(code, "UNKNOWN"), details)
        return answer.FromString(raw)

    def _deliver(self) -> None:
        for future, code, raw, details in self.channel.completions():
            if not future.done():
                future.set_result((code, raw, details))

    async def close(self) -> None:
        """Close the channel once the calls ``relay`` began have ended, a second at
        most; the rest are cancelled and their completions still delivered, so that
        their callers answer (from the batched path) instead of waiting for their
        deadline."""
        loop = self._loop
        relays = (lambda: self.channel.relays) if self.can_relay else (lambda: 0)
        for _ in range(100 if loop is not None else 0):
            if not relays():
                break
            await asyncio.sleep(0.01)
        self.channel.close()
        for future in list(self._waiting):
            future.cancel()
        if loop is None:
            return
        for _ in range(10):
            if not relays():
                break
            await asyncio.sleep(0.01)
        loop.remove_reader(self.channel.fileno())


class PeerClient:
    def __init__(
        self,
        address: str,
        *,
        batch_wait_ms: float = 0.5,
        batch_limit: int = 1000,
        timeout_ms: float = 500.0,
        tls: TLSMaterial | None = None,
        target: str = "",
        native: bool = True,
    ) -> None:
        self.address = address
        self.target = target or address
        self._timeout = timeout_ms / 1000.0
        self._native: _NativeUnary | None = None
        self._channel: grpc.aio.Channel | None = None
        if tls is None and _nativeclient is not None and native:
            self._native = _NativeUnary(self.target, CHANNEL_OPTIONS)
        elif tls is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.secure_channel(
                self.target,
                tls.channel_credentials(),
                options=CHANNEL_OPTIONS + tls.channel_options(),
            )
        if self._channel is not None:
            self._peers = peers_pb2_grpc.PeersV1Stub(self._channel)  # type: ignore[no-untyped-call]
            self._v1 = gubernator_pb2_grpc.V1Stub(self._channel)  # type: ignore[no-untyped-call]
        self._batcher: Batcher[RateLimitRequest, RateLimitResponse] = Batcher(
            self.get_peer_rate_limits, wait=batch_wait_ms / 1000.0, limit=batch_limit
        )
        self.consecutive_failures = 0
        self._errors: deque[tuple[float, str]] = deque(maxlen=20)
        self._log = RateLimitedLog(log, interval=1.0)
        self._relayed_seen = 0

    # -- calls ------------------------------------------------------------------------
    async def get_peer_rate_limits(
        self, requests: Sequence[RateLimitRequest], timeout_ms: float | None = None
    ) -> list[RateLimitResponse]:
        """One GetPeerRateLimits call; raises grpc.aio.AioRpcError on failure."""
        timeout = self._timeout if timeout_ms is None else timeout_ms / 1000.0
        msg = peers_pb2.GetPeerRateLimitsReq(requests=[convert.request_to_pb(r) for r in requests])
        resp = await self._call("GetPeerRateLimits", msg, peers_pb2.GetPeerRateLimitsResp, timeout)
        return [convert.response_from_pb(r) for r in resp.rate_limits]

    async def _call(self, method: str, request: Any, answer: Any, timeout: float) -> Any:
        """One PeersV1 ``method`` call; failures are noted, then raised."""
        try:
            if self._native is not None:
                got = await self._native.call(_PEERS + method, request, answer, timeout)
            else:
                got = await getattr(self._peers, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            self._failed(f"{method}: {exc.code().name}: {exc.details()}")
            raise
        except PeerCallError as exc:
            self._failed(f"{method}: {exc}")
            raise
        self._succeeded()
        return got

    def relay(
        self, request: bytes, items: int, call: Any, done: Callable[[bytes | None], None]
    ) -> bool:
        """Forward one GetPeerRateLimits call on raw bytes, from any thread, for the native
        server's ``call``: the peer's answer (``items`` of them) finishes ``call`` in the
        extensions, on gRPC's thread, with no Python and no event-loop wake-up in between;
        any other outcome (a failure) goes to ``done`` on the event loop (None, or the
        answer's bytes). False, and nothing started, without the native channel, before
        the loop watches it, or while ``RELAYS`` such calls are in flight to this peer:
        the caller then takes the batched path, which also counts failures."""
        native = self._native
        if native is None or native.watching is None or not native.can_relay:
            return False
        args = (_GET_PEER, request, self._timeout, RELAYS, items, call, _Relayed(done))
        try:
            return bool(native.channel.relay(*args))
        except _nativeclient.CallError:
            return False

    def relayed(self) -> int:
        """Items of ``relay`` calls the peer answered since the last call: counted when
        they succeed (in the extension, which finishes them without Python), so that a
        relay that fails and is decided again on the event loop counts once, there."""
        native = self._native
        if native is None or not native.can_relay:
            return 0
        total: int = native.channel.relayed_items
        if total <= self._relayed_seen:  # none new (or the channel closed: 0)
            return 0
        new, self._relayed_seen = total - self._relayed_seen, total
        return new

    @property
    def queued(self) -> int:
        """Forwarded items waiting for the next batch to this peer."""
        return len(self._batcher)

    def forward(self, request: RateLimitRequest) -> asyncio.Future[RateLimitResponse]:
        """Queue ``request`` in the current batch; await the result."""
        return self._batcher.submit(request)

    async def update_peer_globals(
        self, updates: Sequence[peers_pb2.UpdatePeerGlobal], timeout_ms: float | None = None
    ) -> None:
        timeout = self._timeout if timeout_ms is None else timeout_ms / 1000.0
        msg = peers_pb2.UpdatePeerGlobalsReq(globals=updates)
        await self._call("UpdatePeerGlobals", msg, peers_pb2.UpdatePeerGlobalsResp, timeout)

    async def probe(self) -> bool:
        """Does the peer answer LiveCheck? Used to bring a peer back into the ring."""
        try:
            if self._native is not None:
                live = gubernator_pb2.LiveCheckReq()
                answer = gubernator_pb2.LiveCheckResp
                await self._native.call(_LIVE_CHECK, live, answer, self._timeout)
            else:
                await self._v1.LiveCheck(gubernator_pb2.LiveCheckReq(), timeout=self._timeout)
        except (grpc.aio.AioRpcError, PeerCallError):
            return False
        self._succeeded()
        return True

    # -- health -----------------------------------------------------------------------
    def _succeeded(self) -> None:
        """The peer answers: its failures and recent errors are history."""
        self.consecutive_failures = 0
        if self._errors:
            self._errors.clear()

    def _failed(self, message: str) -> None:
        self.consecutive_failures += 1
        self._errors.append((time.monotonic(), message))
        self._log.warning("peer %s: %s", self.address, message)

    def recent_errors(self) -> list[str]:
        if not self._errors:
            return []
        cutoff = time.monotonic() - ERROR_MEMORY_S
        return [msg for at, msg in self._errors if at >= cutoff]

    async def close(self) -> None:
        await self._batcher.close()
        if self._native is not None:
            await self._native.close()
        if self._channel is not None:
            await self._channel.close(None)
