"""``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` on any RateLimiter.

Each request descriptor is looked up in the envoyproxy/ratelimit configuration (or uses
the limit override Envoy sent with it) and becomes one Gubernator-style token-bucket
request: name ``envoy/<domain>``, unique key ``k1=v1&k2=v2`` (URL-escaped entries), hits
= the descriptor's ``hits_addend``, else the request's, else 1. All descriptors of a call go
to the limiter in one batch. A descriptor over its limit makes the whole answer
OVER_LIMIT, unless its limit is in ``shadow_mode`` (judged and counted, answered OK).

Failures: an empty domain or descriptor list is INVALID_ARGUMENT; a limiter exception is
UNAVAILABLE (Envoy then applies its ``failure_mode_deny``); a per-item error from the
limiter fails open (OK) and is counted. Every failure is logged, rate-limited.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from smockron.cluster.envoy.config import UNIT_NAME, UNIT_NUMBER, EnvoyConfig, Limit
from smockron.cluster.envoy.headers import rate_limit_headers
from smockron.cluster.envoy.pb import ratelimit_pb2, rls_pb2
from smockron.cluster.local import epoch_ms
from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimiter,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.cluster.native import NativeServer
from smockron.cluster.threaded import ThreadedServer, fast_or_bridged, keep_none
from smockron.counters import CounterSet
from smockron.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
_MAX_UINT32 = 2**32 - 1


@dataclass(slots=True)
class EnvoyStats(CounterSet):
    """Counters of the Envoy front (exported by whoever runs it)."""

    calls: int = 0
    descriptors: int = 0
    over_limit: int = 0
    shadow_over_limit: int = 0
    invalid: int = 0
    limiter_errors: int = 0
    config_errors: int = 0


class EnvoyStatsCollector(Collector):
    """Exports an EnvoyStats as Prometheus counters ``smockron_envoy_<field>_total``.

    Register it on the registry behind ``/metrics``:
    ``REGISTRY.register(EnvoyStatsCollector(servicer.stats))``.
    """

    def __init__(self, stats: EnvoyStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        for name, value in self.stats.as_dict().items():
            yield CounterMetricFamily(
                f"smockron_envoy_{name}",
                f"Envoy rate limit service: {name.replace('_', ' ')}",
                value=value,
            )


class RateLimitServicer:
    def __init__(
        self,
        limiter: RateLimiter,
        config: EnvoyConfig,
        clock: Callable[[], int] = epoch_ms,
        *,
        response_headers: bool = False,
    ) -> None:
        self.limiter = limiter
        self.config = config
        self.response_headers = response_headers
        self.stats = EnvoyStats()
        self._clock = clock
        self._log = RateLimitedLog(log)

    async def ShouldRateLimit(
        self,
        request: rls_pb2.RateLimitRequest | None,
        context: grpc.aio.ServicerContext[rls_pb2.RateLimitRequest, rls_pb2.RateLimitResponse],
    ) -> rls_pb2.RateLimitResponse:
        self.stats.calls += 1
        if request is None:
            self.stats.invalid += 1
            self._log.warning("envoy: rejected a malformed RateLimitRequest", key="malformed")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed RateLimitRequest")
        if not request.domain or not request.descriptors:
            self.stats.invalid += 1
            what = "domain" if not request.domain else "descriptor list"
            self._log.warning("envoy: rejected request: empty %s", what, key="invalid")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"rate limit {what} is empty")
        limits, batch, now = self._plan(request)
        try:
            answers = await self.limiter.get_rate_limits(batch) if batch else []
        except Exception as exc:  # the limiter's failure must not look like a verdict
            self.stats.limiter_errors += 1
            self._log.warning("envoy: limiter failed: %r", exc, key="limiter")
            await context.abort(grpc.StatusCode.UNAVAILABLE, "rate limiter unavailable")
        return self._respond(limits, answers, now)

    def answer_here(
        self,
        request: rls_pb2.RateLimitRequest,
        decide: Callable[[list[RateLimitRequest]], list[RateLimitResponse] | None],
    ) -> rls_pb2.RateLimitResponse | None:
        """ShouldRateLimit without the event loop, for the threaded server: None (nothing
        counted) when the request is invalid or ``decide`` (``Node.answer_here``) cannot
        answer alone; the caller then takes the asyncio path."""
        if not request.domain or not request.descriptors:
            return None
        limits, batch, now = self._plan(request)
        answers = decide(batch) if batch else []
        if answers is None:
            return None
        self.stats.calls += 1
        return self._respond(limits, answers, now)

    def _plan(
        self, request: rls_pb2.RateLimitRequest
    ) -> tuple[list[Limit | None], list[RateLimitRequest], int]:
        """(each descriptor's limit, the checks to make, now)."""
        now = self._clock()
        limits = [self._limit_for(request.domain, d) for d in request.descriptors]
        batch: list[RateLimitRequest] = []
        for descriptor, limit in zip(request.descriptors, limits, strict=True):
            if limit is not None and not limit.unlimited:
                batch.append(self._to_request(request, descriptor, limit, now))
        return limits, batch, now

    def _respond(
        self, limits: list[Limit | None], answer_list: list[RateLimitResponse], now: int
    ) -> rls_pb2.RateLimitResponse:
        answers = iter(answer_list)
        response = rls_pb2.RateLimitResponse(overall_code=OK)
        for limit in limits:
            status = response.statuses.add()
            self.stats.descriptors += 1
            if limit is None or limit.unlimited:
                status.code = OK
                status.limit_remaining = _MAX_UINT32 if limit is not None else 0
                continue
            self._fill(status, limit, next(answers), now)
            if status.code == OVER_LIMIT:
                response.overall_code = OVER_LIMIT
        if self.response_headers:
            for name, value in rate_limit_headers(response.statuses):
                response.response_headers_to_add.add(key=name, value=value)
        return response

    def _limit_for(
        self, domain: str, descriptor: ratelimit_pb2.RateLimitDescriptor
    ) -> Limit | None:
        if descriptor.HasField("limit") and descriptor.limit.unit in UNIT_NAME:
            return Limit(descriptor.limit.requests_per_unit, UNIT_NAME[descriptor.limit.unit])
        entries = [(e.key, e.value) for e in descriptor.entries]
        return self.config.find(domain, entries)

    @staticmethod
    def _to_request(
        request: rls_pb2.RateLimitRequest,
        descriptor: ratelimit_pb2.RateLimitDescriptor,
        limit: Limit,
        now: int,
    ) -> RateLimitRequest:
        if descriptor.HasField("hits_addend"):
            hits = descriptor.hits_addend.value
        else:
            hits = request.hits_addend or 1
        duration, gregorian = limit.window
        key = "&".join(
            f"{quote(e.key, safe='')}={quote(e.value, safe='')}" for e in descriptor.entries
        )
        return RateLimitRequest(
            name=f"envoy/{request.domain}",
            unique_key=key or "-",
            hits=hits,
            limit=limit.requests_per_unit,
            duration=duration,
            algorithm=Algorithm.TOKEN_BUCKET,
            behavior=Behavior.DURATION_IS_GREGORIAN if gregorian else Behavior.BATCHING,
            created_at=now,
        )

    def _fill(
        self,
        status: rls_pb2.RateLimitResponse.DescriptorStatus,
        limit: Limit,
        answer: RateLimitResponse,
        now: int,
    ) -> None:
        status.current_limit.requests_per_unit = limit.requests_per_unit
        status.current_limit.unit = UNIT_NUMBER[limit.unit]  # type: ignore[assignment]
        status.current_limit.name = limit.name
        if answer.error:
            self.stats.limiter_errors += 1
            self._log.warning("envoy: limiter error, failing open: %s", answer.error, key="item")
            status.code = OK
            return
        status.limit_remaining = max(0, min(_MAX_UINT32, answer.remaining))
        status.duration_until_reset.CopyFrom(_duration_ms(max(0, answer.reset_time - now)))
        over = answer.status == Status.OVER_LIMIT
        if over and limit.shadow_mode:
            self.stats.shadow_over_limit += 1
            self._log.warning("envoy: shadow_mode limit %r over limit", limit.name, key="shadow")
        elif over:
            self.stats.over_limit += 1
        status.code = OVER_LIMIT if over and not limit.shadow_mode else OK


def _duration_ms(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def add_to_server(
    server: grpc.aio.Server | ThreadedServer | NativeServer,
    limiter: RateLimiter,
    config: EnvoyConfig,
    clock: Callable[[], int] = epoch_ms,
    *,
    response_headers: bool = False,
) -> RateLimitServicer:
    """Serve ShouldRateLimit on ``server``; the servicer is returned for its stats/config.

    ``response_headers=True`` adds ``x-ratelimit-limit``, ``-remaining`` and ``-reset`` to
    ``response_headers_to_add`` (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED).

    The handler is registered by hand (not with the generated helper) so that bytes that do
    not decode reach the servicer as None and are counted and logged like other bad input.
    """
    servicer = RateLimitServicer(limiter, config, clock, response_headers=response_headers)
    decide = getattr(limiter, "answer_here", None)
    if isinstance(server, ThreadedServer | NativeServer) and decide is not None:
        # checks the node decides alone are answered on the gRPC thread (see threaded.py)
        threaded = grpc.unary_unary_rpc_method_handler(
            fast_or_bridged(
                lambda request: servicer.answer_here(request, decide),
                servicer.ShouldRateLimit,
                server.loop,
            ),
            request_deserializer=keep_none(_parse_request),
            response_serializer=rls_pb2.RateLimitResponse.SerializeToString,
        )
        server.add_threaded_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"ShouldRateLimit": threaded}),)
        )
    method = grpc.unary_unary_rpc_method_handler(
        servicer.ShouldRateLimit,
        request_deserializer=_parse_request,
        response_serializer=rls_pb2.RateLimitResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"ShouldRateLimit": method}),)
    )
    return servicer


def _parse_request(data: bytes) -> rls_pb2.RateLimitRequest | None:
    """Decode, or None for bytes that are not a RateLimitRequest (the servicer rejects it)."""
    try:
        return rls_pb2.RateLimitRequest.FromString(data)
    except DecodeError:
        return None
