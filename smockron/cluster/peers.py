"""The client side of PeersV1: one PeerClient per other node, with its own batcher.

A PeerClient remembers recent errors (HealthCheck reports them, like Gubernator's
``GetLastErr``) and counts consecutive failures so the node can take a dead owner out
of the ring and answer locally instead of failing. The first successful call or probe
forgets the errors: a peer that is back makes the node healthy at once, not a minute
later.

A peer is named by its gRPC address (the ring, HealthCheck) and called at ``target``,
its PeersV1 listener (the gRPC address itself when PeersV1 shares the gRPC port).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence

import grpc

from smockron.cluster import convert
from smockron.cluster.batching import Batcher
from smockron.cluster.model import RateLimitRequest, RateLimitResponse
from smockron.cluster.pb import gubernator_pb2, gubernator_pb2_grpc, peers_pb2, peers_pb2_grpc
from smockron.cluster.tls import TLSMaterial
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.cluster.peers")

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # Fail fast and retry the connection soon: a restarted peer is back within a second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]
ERROR_MEMORY_S = 60.0


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
    ) -> None:
        self.address = address
        self.target = target or address
        self._timeout = timeout_ms / 1000.0
        if tls is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.secure_channel(
                self.target,
                tls.channel_credentials(),
                options=CHANNEL_OPTIONS + tls.channel_options(),
            )
        self._peers = peers_pb2_grpc.PeersV1Stub(self._channel)  # type: ignore[no-untyped-call]
        self._v1 = gubernator_pb2_grpc.V1Stub(self._channel)  # type: ignore[no-untyped-call]
        self._batcher: Batcher[RateLimitRequest, RateLimitResponse] = Batcher(
            self.get_peer_rate_limits, wait=batch_wait_ms / 1000.0, limit=batch_limit
        )
        self.consecutive_failures = 0
        self._errors: deque[tuple[float, str]] = deque(maxlen=20)
        self._log = RateLimitedLog(log, interval=1.0)

    # -- calls ------------------------------------------------------------------------
    async def get_peer_rate_limits(
        self, requests: Sequence[RateLimitRequest], timeout_ms: float | None = None
    ) -> list[RateLimitResponse]:
        """One GetPeerRateLimits call; raises grpc.aio.AioRpcError on failure."""
        timeout = self._timeout if timeout_ms is None else timeout_ms / 1000.0
        msg = peers_pb2.GetPeerRateLimitsReq(requests=[convert.request_to_pb(r) for r in requests])
        try:
            resp = await self._peers.GetPeerRateLimits(msg, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            self._failed(f"GetPeerRateLimits: {exc.code().name}: {exc.details()}")
            raise
        self._succeeded()
        return [convert.response_from_pb(r) for r in resp.rate_limits]

    def forward(self, request: RateLimitRequest) -> asyncio.Future[RateLimitResponse]:
        """Queue ``request`` in the current batch; await the result."""
        return self._batcher.submit(request)

    async def update_peer_globals(
        self, updates: Sequence[peers_pb2.UpdatePeerGlobal], timeout_ms: float | None = None
    ) -> None:
        timeout = self._timeout if timeout_ms is None else timeout_ms / 1000.0
        try:
            await self._peers.UpdatePeerGlobals(
                peers_pb2.UpdatePeerGlobalsReq(globals=updates), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            self._failed(f"UpdatePeerGlobals: {exc.code().name}: {exc.details()}")
            raise
        self._succeeded()

    async def probe(self) -> bool:
        """Does the peer answer LiveCheck? Used to bring a peer back into the ring."""
        try:
            await self._v1.LiveCheck(gubernator_pb2.LiveCheckReq(), timeout=self._timeout)
        except grpc.aio.AioRpcError:
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
        await self._channel.close(None)
