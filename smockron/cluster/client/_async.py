"""The asyncio client: ``AsyncClient`` (see smockron.cluster.client._client)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

import grpc
import grpc.aio

from smockron.cluster.client._base import BaseClient, decoded
from smockron.cluster.client._channel import (
    CODES,
    HTTP_PATH,
    PATH,
    NativeCallError,
    coded_error,
    nativeclient,
    rpc_error,
    status_error,
)
from smockron.cluster.client._coalesce import AsyncCoalescer
from smockron.cluster.client._http import AsyncHttpTransport
from smockron.cluster.client._httpcodec import CallError, encode_requests
from smockron.cluster.client._messages import (
    MAX_BATCH_SIZE,
    HealthCheck,
    as_field1,
    checked,
    encode_batches,
    health_of,
    make_request,
    native_response,
    only_field1,
    responses_of,
    single_of,
)
from smockron.cluster.client._routing import Outcome, Route
from smockron.cluster.model import Algorithm, Behavior, RateLimitRequest, RateLimitResponse
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.errors import ClientError, ClientUnavailable

pb_grpc: Any = gubernator_pb2_grpc  # generated without type hints

_Send = Callable[
    ["AsyncClient", Sequence[RateLimitRequest], float | None], Awaitable[list[RateLimitResponse]]
]


class AsyncClient(BaseClient[AsyncHttpTransport]):
    """asyncio client; create and use it inside one event loop. On the native channel a
    call's end reaches the loop through an eventfd it watches (no thread per call); on
    grpcio it is a ``grpc.aio`` channel. ``http_address``, ``ssl_context`` and
    ``transport`` as for ``Client``: lone checks then go over HTTP/1.1 connections kept
    alive on the loop (``AsyncHttpTransport``)."""

    _http_class = AsyncHttpTransport
    coalescer: AsyncCoalescer | None
    """Concurrent ``check`` calls on this client's loop go in one GetRateLimits."""

    def _start(self, coalesce: bool) -> None:
        self._channel: grpc.aio.Channel | None = self._grpcio_channel(
            grpc.aio.insecure_channel, grpc.aio.secure_channel
        )
        self._stub: Any = self._channel and pb_grpc.V1Stub(self._channel)
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop watching the native channel's completions (set by the first call)."""
        self._waiting: set[asyncio.Future[tuple[int, bytes | None, str]]] = set()
        lone = self._one if self.http is None else self._one_http
        self.coalescer = AsyncCoalescer(self._get, lone) if coalesce else None
        self._route(None if self.coalescer is None else self.coalescer.check, lone)
        self._refreshing: asyncio.Task[None] | None = None

    async def get_rate_limits(
        self, requests: Sequence[RateLimitRequest], *, timeout: float | None = None
    ) -> list[RateLimitResponse]:
        """One response per request, in order; each owner's part goes to it, the parts
        (and batches of 1,000) concurrently."""
        if self.ring is None or not requests:
            return await self._get(requests, timeout)
        return await self._drive(Route(self.ring, requests), AsyncClient._get, timeout)

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
        req = make_request(name, key, hits, limit, duration, algorithm, behavior, burst, metadata)
        ring = self.ring
        if ring is None or (ring.alone and not ring.due()):  # one node: no owner to pick
            return checked(await self._via(timeout)(req), name, key)
        route = Route(ring, (req,), fallback=True)
        return checked((await self._drive(route, AsyncClient._send_one, timeout))[0], name, key)

    async def health_check(self, *, timeout: float | None = None) -> HealthCheck:
        req = pb.HealthCheckReq()
        return health_of(await self._invoke("HealthCheck", req, pb.HealthCheckResp, timeout))

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

    # -- routing: the parts of a Route sent as concurrent tasks (a lone part: no task)
    async def _drive(
        self, route: Route, send: _Send, timeout: float | None
    ) -> list[RateLimitResponse]:
        ring = route.ring
        while True:
            if ring.due():
                await self._refresh_due()
            parts = route.parts()
            if len(parts) == 1:  # no task: this one sends it
                owner, part = parts[0]
                try:
                    outcomes: list[Outcome] = [await send(self._node(owner), part, timeout)]
                except ClientUnavailable as exc:
                    outcomes = [exc]
            else:
                outcomes = await asyncio.gather(
                    *(self._outcome(send, owner, part, timeout) for owner, part in parts)
                )
            if route.take(outcomes):
                return route.answers

    async def _outcome(
        self, send: _Send, owner: str | None, part: Sequence[RateLimitRequest], t: float | None
    ) -> Outcome:
        try:
            return await send(self._node(owner), part, t)
        except ClientUnavailable as exc:
            return exc

    async def _send_one(
        self, requests: Sequence[RateLimitRequest], timeout: float | None
    ) -> list[RateLimitResponse]:
        """A routed check, coalesced with others to the same node unless it has a timeout."""
        return [await self._via(timeout)(requests[0])]

    async def _refresh_due(self) -> None:
        """The first time, wait for the node list; later re-read it in the background."""
        ring = self.ring
        assert ring is not None
        if not ring.learned:
            await self._refresh()
        elif self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        nodes = self._to_ask()
        if nodes is None:
            return
        answer = None
        try:
            for node in nodes:
                with contextlib.suppress(ClientError):
                    answer = node, await node.health_check(timeout=self._health_wait)
                    break
        finally:
            for gone in self._asked(answer):
                await gone.close()

    # -- calls on this client's own address
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
        batches = encode_batches(requests)
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
            batch = encode_batches((request,))[0]
            got = await self._invoke("GetRateLimits", batch, pb.GetRateLimitsResp, timeout)
            return single_of(batch, got, self.address)
        r = request
        item = nativeclient.encode_request(
            r.name,
            r.unique_key,
            r.hits,
            r.limit,
            r.duration,
            r.algorithm,
            r.behavior,
            r.burst,
            r.metadata or None,
            r.created_at,
        )
        raw = await self._raw("GetRateLimits", as_field1(item), timeout)
        answer = only_field1(raw)
        if answer is None:  # not one answer in the plain form: the generated classes judge
            return single_of(
                encode_batches((request,))[0], pb.GetRateLimitsResp.FromString(raw), self.address
            )
        return native_response(nativeclient.decode_response(answer))

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
            body = await http.post(HTTP_PATH, encode_requests(requests), self._deadline(timeout))
        except CallError as exc:
            raise coded_error(exc, http.address, "GetRateLimits") from exc
        return decoded(body, len(requests), http.address)

    async def _call(
        self, batch: pb.GetRateLimitsReq, timeout: float | None
    ) -> list[RateLimitResponse]:
        got = await self._invoke("GetRateLimits", batch, pb.GetRateLimitsResp, timeout)
        return responses_of(batch, got, self.address)

    async def _invoke(self, method: str, request: Any, answer: Any, timeout: float | None) -> Any:
        """One unary call of V1 ``method``; the ``answer`` message, or a ClientError."""
        deadline = self._deadline(timeout)
        if self._native is None:
            try:
                return await getattr(self._stub, method)(request, timeout=deadline)
            except grpc.RpcError as exc:
                raise rpc_error(exc, self.address, method) from exc
        return answer.FromString(await self._raw(method, request.SerializeToString(), timeout))

    # -- the native channel's calls, completed through an eventfd the loop watches
    async def _raw(self, method: str, payload: bytes, timeout: float | None) -> bytes:
        """One unary call of V1 ``method`` on the native channel, on bytes."""
        future = self._watch().create_future()
        try:
            self._native.start(PATH + method, payload, self._deadline(timeout), future)
        except NativeCallError as exc:
            raise coded_error(exc, self.address, method) from exc
        self._waiting.add(future)
        try:
            code, raw, details = await future
        finally:
            self._waiting.discard(future)
        if raw is None:
            raise status_error(
                CODES.get(code, grpc.StatusCode.UNKNOWN), details, self.address, method
            )
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
