"""The blocking client: ``Client`` (see smockron.cluster.client._client)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

import grpc

from smockron.cluster.client._base import BaseClient, decoded
from smockron.cluster.client._channel import (
    GET_RATE_LIMITS,
    HTTP_PATH,
    PATH,
    NativeCallError,
    coded_error,
    rpc_error,
)
from smockron.cluster.client._coalesce import Coalescer, NativeCoalescer
from smockron.cluster.client._http import HttpTransport
from smockron.cluster.client._httpcodec import CallError, encode_requests
from smockron.cluster.client._messages import (
    MAX_BATCH_SIZE,
    HealthCheck,
    checked,
    encode_batches,
    health_of,
    make_request,
    native_response,
    responses_of,
    single_of,
)
from smockron.cluster.client._routing import Outcome, Route
from smockron.cluster.model import Algorithm, Behavior, RateLimitRequest, RateLimitResponse
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.errors import ClientError, ClientUnavailable

pb_grpc: Any = gubernator_pb2_grpc  # generated without type hints

_Send = Callable[["Client", Sequence[RateLimitRequest], float | None], list[RateLimitResponse]]


class Client(BaseClient[HttpTransport]):
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

    _http_class = HttpTransport
    coalescer: Coalescer | NativeCoalescer | None
    """Concurrent ``check`` calls of this client's threads go in one GetRateLimits:
    inside the native channel when every check goes there (see NativeCoalescer), else
    in Python."""

    def _start(self, coalesce: bool) -> None:
        self._channel: grpc.Channel | None = self._grpcio_channel(
            grpc.insecure_channel, grpc.secure_channel
        )
        self._stub: Any = self._channel and pb_grpc.V1Stub(self._channel)
        lone = self._one if self.http is None else self._one_http
        self.coalescer = None
        if coalesce and self._native is not None and self.http is None:
            self.coalescer = NativeCoalescer(self._check_native, self._native)
        elif coalesce:
            self.coalescer = Coalescer(self._get, lone)
        self._route(None if self.coalescer is None else self.coalescer.check, lone)
        self._pool: ThreadPoolExecutor | None = None
        """Sends the parts of a batch owned by different nodes in parallel."""
        self._refresher: threading.Thread | None = None

    def get_rate_limits(
        self, requests: Sequence[RateLimitRequest], *, timeout: float | None = None
    ) -> list[RateLimitResponse]:
        """One response per request, in order; per-item errors are in ``error``. Each
        owner's part goes to it, the parts in parallel."""
        if self.ring is None or not requests:
            return self._get(requests, timeout)
        return self._drive(Route(self.ring, requests), Client._get, timeout)

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
        req = make_request(name, key, hits, limit, duration, algorithm, behavior, burst, metadata)
        ring = self.ring
        if ring is None or (ring.alone and not ring.due()):  # one node: no owner to pick
            return checked(self._via(timeout)(req), name, key)
        route = Route(ring, (req,), fallback=True)
        return checked(self._drive(route, Client._send_one, timeout)[0], name, key)

    def health_check(self, *, timeout: float | None = None) -> HealthCheck:
        req = pb.HealthCheckReq()
        return health_of(self._invoke("HealthCheck", req, pb.HealthCheckResp, timeout))

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

    # -- routing: the parts of a Route sent, the first on this thread, the rest on the pool
    def _drive(self, route: Route, send: _Send, timeout: float | None) -> list[RateLimitResponse]:
        ring = route.ring
        while True:
            if ring.due():
                self._refresh_due()
            parts = route.parts()
            if len(parts) == 1:  # no thread: this one sends it
                owner, part = parts[0]
                try:
                    outcomes: list[Outcome] = [send(self._node(owner), part, timeout)]
                except ClientUnavailable as exc:
                    outcomes = [exc]
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(8, thread_name_prefix="smockron-client")
                pending = [
                    self._pool.submit(self._outcome, send, o, p, timeout) for o, p in parts[1:]
                ]
                outcomes = [self._outcome(send, *parts[0], timeout)]
                outcomes.extend(f.result() for f in pending)
            if route.take(outcomes):
                return route.answers

    def _outcome(
        self, send: _Send, owner: str | None, part: Sequence[RateLimitRequest], t: float | None
    ) -> Outcome:
        try:
            return send(self._node(owner), part, t)
        except ClientUnavailable as exc:
            return exc

    def _send_one(
        self, requests: Sequence[RateLimitRequest], timeout: float | None
    ) -> list[RateLimitResponse]:
        """A routed check, coalesced with others to the same node unless it has a timeout."""
        return [self._via(timeout)(requests[0])]

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
        nodes = self._to_ask()
        if nodes is None:
            return
        answer = None
        try:
            for node in nodes:
                with contextlib.suppress(ClientError):
                    answer = node, node.health_check(timeout=self._health_wait)
                    break
        finally:
            for gone in self._asked(answer):
                gone.close()

    # -- calls on this client's own address
    def _get(
        self, requests: Sequence[RateLimitRequest], timeout: float | None = None
    ) -> list[RateLimitResponse]:
        """get_rate_limits on ``address`` alone."""
        out: list[RateLimitResponse] = []
        if self._batches_over_http:
            for i in range(0, len(requests), MAX_BATCH_SIZE):
                out.extend(self._post(requests[i : i + MAX_BATCH_SIZE], timeout))
            return out
        for batch in encode_batches(requests):
            got = self._invoke("GetRateLimits", batch, pb.GetRateLimitsResp, timeout)
            out.extend(responses_of(batch, got, self.address))
        return out

    def _one(self, request: RateLimitRequest, timeout: float | None = None) -> RateLimitResponse:
        """get_rate_limits for a single request over gRPC, without the list machinery."""
        batch = encode_batches((request,))[0]
        got = self._invoke("GetRateLimits", batch, pb.GetRateLimitsResp, timeout)
        return single_of(batch, got, self.address)

    def _one_http(
        self, request: RateLimitRequest, timeout: float | None = None
    ) -> RateLimitResponse:
        return self._post((request,), timeout)[0]

    def _check_native(self, r: RateLimitRequest) -> RateLimitResponse:
        """One check coalesced inside the native channel, which encodes the request's
        fields and decodes the answer's (no protobuf objects in Python)."""
        try:
            fields = self._native.check(
                GET_RATE_LIMITS,
                self.timeout,
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
        except NativeCallError as exc:
            raise coded_error(exc, self.address, "GetRateLimits") from exc
        return native_response(fields)

    def _post(
        self, requests: Sequence[RateLimitRequest], timeout: float | None
    ) -> list[RateLimitResponse]:
        """GetRateLimits (at most 1,000 requests) over the HTTP gateway."""
        http = self.http
        assert http is not None
        try:
            body = http.post(HTTP_PATH, encode_requests(requests), self._deadline(timeout))
        except CallError as exc:
            raise coded_error(exc, http.address, "GetRateLimits") from exc
        return decoded(body, len(requests), http.address)

    def _invoke(self, method: str, request: Any, answer: Any, timeout: float | None) -> Any:
        """One unary call of V1 ``method``; the ``answer`` message, or a ClientError."""
        deadline = self._deadline(timeout)
        try:
            if self._native is not None:
                raw = self._native.call(PATH + method, request.SerializeToString(), deadline)
                return answer.FromString(raw)
            return getattr(self._stub, method)(request, timeout=deadline)
        except grpc.RpcError as exc:
            raise rpc_error(exc, self.address, method) from exc
        except NativeCallError as exc:
            raise coded_error(exc, self.address, method) from exc
