"""``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` on any RateLimiter.

Each request descriptor is looked up in the envoyproxy/ratelimit configuration (or uses
the limit override Envoy sent with it, when the domain is configured) and becomes one
token-bucket request: name ``envoy/<domain>``, unique key ``k1=v1&k2=v2`` (URL-escaped
entries; a ``share_threshold`` wildcard's pattern replaces the value; ``@<window start>``
appended for second and week windows, which are aligned to the epoch as upstream's), hits
= the descriptor's ``hits_addend``, else the request's, else 1. All descriptors of a call go
to the limiter in one batch.

Upstream's fixed window (redis ``INCRBY``) counts refused hits too: once a window is over
its limit, every later request with hits is refused until the window ends. A refused
request that still left room (``limit_remaining`` > 0 before it) is therefore followed by
a second check with ``DRAIN_OVER_LIMIT`` that empties the window. The first check consumes
nothing when refused, so its answer gives the count before the request, from which the
``over_limit`` / ``near_limit`` / ``within_limit`` counters are split as upstream splits them.

The answer follows upstream's service: OVER_LIMIT when a descriptor that is not a quota is
over, or when every quota descriptor is (``quota_mode`` / ``QUOTA_MODE``); ``shadow_mode``
descriptors are judged, counted and answered OK; ``SHADOW_MODE`` makes every answer OK; a
limit whose ``name`` another matched limit ``replaces`` is not checked.

Failures: an empty domain or descriptor list is INVALID_ARGUMENT; a limiter exception is
UNAVAILABLE (Envoy then applies its ``failure_mode_deny``); a per-item error from the
limiter fails open (OK) and is counted. With no configuration loaded (``config`` None: the
files did not load at start, envoyproxy/ratelimit mode) every call is UNKNOWN "no rate
limit configuration loaded", as upstream answers. Every failure is logged, rate-limited.

``decide()`` is the same answer without gRPC (``ServiceError`` for the failures), for
upstream's ``POST /json``. Subclasses count elsewhere by overriding ``_limit`` (the Redis
backend, redis_cache.py).

Modules: the request resolved against the config in ``plan``, the answer's pure pieces
in ``answer``; here the servicer (the limiter asked, the answer and its counters) and
its registration on a gRPC server.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError

from smockron.cluster.envoy.answer import ceil_s, dynamic_metadata
from smockron.cluster.envoy.config import (
    MAX_UINT32,
    UNIT_NUMBER,
    EnvoyConfig,
    Limit,
)
from smockron.cluster.envoy.headers import rate_limit_headers, speaking_status
from smockron.cluster.envoy.pb import rls_pb2
from smockron.cluster.envoy.plan import Check, Plan, check_of, drains_of, match_of
from smockron.cluster.envoy.settings import EnvoySettings
from smockron.cluster.envoy.stats import (
    EnvoyStats,
    EnvoyStatsCollector,
    LimitStats,
    ServerStats,
    UpstreamMetrics,
    near_threshold,
    record,
)
from smockron.cluster.local import epoch_ms
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.model import (
    RateLimiter,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.cluster.node import Node
from smockron.cluster.transports import GrpcServer
from smockron.cluster.transports.native import NativeServer
from smockron.cluster.transports.threaded import ThreadedServer, fast_or_bridged, keep_none
from smockron.ratelog import RateLimitedLog

__all__ = [
    "EnvoyStats",
    "EnvoyStatsCollector",
    "RateLimitServicer",
    "ServiceError",
    "add_to_server",
]

log = logging.getLogger(__name__)

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT

Decide = Callable[[list[RateLimitRequest]], list[RateLimitResponse] | None]

NO_CONFIG = "no rate limit configuration loaded"


class ServiceError(Exception):
    """A call that gets no answer: the gRPC status and upstream's message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RateLimitServicer:
    def __init__(
        self,
        limiter: RateLimiter,
        config: EnvoyConfig | None,
        clock: Callable[[], int] = epoch_ms,
        *,
        response_headers: bool | None = None,
        settings: EnvoySettings | None = None,
        metrics: ClusterMetrics | None = None,
    ) -> None:
        """``settings`` default to envoyproxy/ratelimit's environment variables;
        ``response_headers``, when given, overrides their LIMIT_RESPONSE_HEADERS_ENABLED;
        ``metrics``: the node whose registry exports the counters under upstream's names
        (none: they are only read here)."""
        settings = settings if settings is not None else EnvoySettings.from_env()
        if response_headers is not None:
            settings = dataclasses.replace(settings, response_headers=response_headers)
        self.limiter = limiter
        self.config = config
        self.settings = settings
        self.stats = EnvoyStats(config_loads=int(config is not None))
        self.limit_stats: dict[str, LimitStats] = {}
        self.domain_not_found: dict[str, int] = {}
        self.server_stats: ServerStats | None = None
        """Set in envoyproxy/ratelimit mode: each gRPC call counted and timed."""
        self._near_ratio = settings.near_limit_ratio
        self._clock = clock
        self._log = RateLimitedLog(log)
        if metrics is not None:
            metrics.shared(UpstreamMetrics.NAME, UpstreamMetrics).sources.add(self)

    fast_path = True
    """Whether checks the node decides alone may be answered on the gRPC thread
    (``answer_here``); a subclass that counts elsewhere says no."""

    @property
    def response_headers(self) -> bool:
        return self.settings.response_headers

    async def ShouldRateLimit(
        self,
        request: rls_pb2.RateLimitRequest | None,
        context: grpc.aio.ServicerContext[rls_pb2.RateLimitRequest, rls_pb2.RateLimitResponse],
    ) -> rls_pb2.RateLimitResponse:
        start = time.perf_counter()
        try:
            return await self.decide(request)
        except ServiceError as exc:
            await context.abort(exc.code, exc.message)
            raise  # abort raises; this line is for the type checker
        finally:
            if self.server_stats is not None and request is not None:
                self.server_stats.record("ShouldRateLimit", time.perf_counter() - start)

    async def decide(self, request: rls_pb2.RateLimitRequest | None) -> rls_pb2.RateLimitResponse:
        """The answer to one request; ServiceError when there is none."""
        self.stats.calls += 1
        if request is None:
            self.stats.invalid += 1
            self._log.warning("envoy: rejected a malformed RateLimitRequest", key="malformed")
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "malformed RateLimitRequest")
        if not request.domain or not request.descriptors:
            self.stats.invalid += 1
            what = "domain" if not request.domain else "descriptor list"
            self._log.warning("envoy: rejected request: empty %s", what, key="invalid")
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT, f"rate limit {what} must not be empty"
            )
        if self.config is None:
            self.stats.invalid += 1
            self._log.warning("envoy: %s", NO_CONFIG, key="no-config")
            raise ServiceError(grpc.StatusCode.UNKNOWN, NO_CONFIG)
        plan = self._plan(request, self.config)
        try:
            answers = await self._limit(plan)
        except Exception as exc:  # the limiter's failure must not look like a verdict
            self.stats.limiter_errors += 1
            self._log.warning("envoy: limiter failed: %r", exc, key="limiter")
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "rate limiter unavailable") from None
        return self._respond(plan, answers)

    async def _limit(self, plan: Plan) -> list[RateLimitResponse]:
        """The limiter's answers to ``plan.checks``, in order (raises when it fails)."""
        answers = await self.limiter.get_rate_limits(plan.batch) if plan.checks else []
        drains = self._drains(plan, answers)
        if drains:
            try:
                await self.limiter.get_rate_limits(drains)
            except Exception as exc:  # the verdict stands; only later calls may differ
                self._drain_failed(repr(exc))
        return answers

    def answer_here(
        self, request: rls_pb2.RateLimitRequest, decide: Decide
    ) -> rls_pb2.RateLimitResponse | None:
        """ShouldRateLimit without the event loop, for the threaded server: None (nothing
        counted) when the request is invalid or ``decide`` (``Node.answer_here``) cannot
        answer alone; the caller then takes the asyncio path."""
        start = time.perf_counter()
        config = self.config
        if not request.domain or not request.descriptors or config is None:
            return None
        plan = self._plan(request, config)
        answers = decide(plan.batch) if plan.checks else []
        if answers is None:
            return None
        drains = self._drains(plan, answers)
        if drains and decide(drains) is None:  # owners moved between the two checks
            self._drain_failed("not owned here any more")
        self.stats.calls += 1
        response = self._respond(plan, answers)
        if self.server_stats is not None:
            self.server_stats.record("ShouldRateLimit", time.perf_counter() - start)
        return response

    # -- before the limiter -----------------------------------------------------------------

    def _plan(self, request: rls_pb2.RateLimitRequest, config: EnvoyConfig) -> Plan:
        now = self._clock()
        domain = request.domain
        matches = [self._match(config, domain, d) for d in request.descriptors]
        unlimited = [m is not None and m.limit.unlimited for m in matches]
        replaced = {name for m in matches if m is not None for name in m.limit.replaces}
        checks = []
        for i, (descriptor, match) in enumerate(zip(request.descriptors, matches, strict=True)):
            if match is None or unlimited[i]:
                continue
            if match.limit.name and match.limit.name in replaced:
                continue
            checks.append(self._check(i, request, descriptor, match, now))
        return Plan(request, now, domain in config.domains, unlimited, checks)

    _match = staticmethod(match_of)
    _check = staticmethod(check_of)
    """How a matched descriptor becomes a Check (a subclass adds to it)."""

    _drains = staticmethod(drains_of)

    def _drain_failed(self, why: str) -> None:
        self.stats.limiter_errors += 1
        self._log.warning("envoy: could not count refused hits: %s", why, key="drain")

    # -- the answer -------------------------------------------------------------------------

    def _respond(self, plan: Plan, answers: list[RateLimitResponse]) -> rls_pb2.RateLimitResponse:
        request, settings = plan.request, self.settings
        if not plan.known_domain:
            count = self.domain_not_found.get(request.domain, 0)
            self.domain_not_found[request.domain] = count + len(request.descriptors)
        by_index = {c.index: (c, a) for c, a in zip(plan.checks, answers, strict=True)}
        response = rls_pb2.RateLimitResponse()
        refusing, passed = [False] * len(request.descriptors), []
        failed_rate = failed_quota = total_quota = 0
        for i in range(len(request.descriptors)):
            status = response.statuses.add()
            self.stats.descriptors += 1
            if plan.unlimited[i]:
                status.code, status.limit_remaining = OK, MAX_UINT32
                continue
            checked = by_index.get(i)
            quota = settings.quota_mode or (
                checked is not None and checked[0].match.limit.quota_mode
            )
            total_quota += quota
            if checked is None:
                status.code = OK
            else:
                self._fill(status, checked[0], checked[1], plan.now)
            if status.code == OVER_LIMIT:
                refusing[i] = not quota
                failed_quota += quota
                failed_rate += not quota
            else:
                passed.append(i)
        over = failed_rate > 0 or (total_quota > 0 and total_quota == failed_quota)
        if settings.response_headers:
            self._add_headers(response, refusing, by_index, plan.now)
        if over and settings.shadow_mode:
            over = False
            self.stats.global_shadow_mode += 1
        if settings.dynamic_metadata:
            metadata = [by_index[i][0].match.metadata for i in passed if i in by_index]
            response.dynamic_metadata.CopyFrom(dynamic_metadata(request, metadata))
        response.overall_code = OVER_LIMIT if over else OK
        return response

    def _fill(
        self,
        status: rls_pb2.RateLimitResponse.DescriptorStatus,
        check: Check,
        answer: RateLimitResponse,
        now: int,
    ) -> None:
        limit = check.match.limit
        status.current_limit.requests_per_unit = limit.requests_per_unit
        status.current_limit.unit = UNIT_NUMBER[limit.unit]  # type: ignore[assignment]
        status.current_limit.name = limit.name
        status.duration_until_reset.CopyFrom(Duration(seconds=ceil_s(check.window_end - now)))
        if answer.error:
            self.stats.limiter_errors += 1
            self._log.warning("envoy: limiter error, failing open: %s", answer.error, key="item")
            status.code = OK
            return
        over = answer.status == Status.OVER_LIMIT
        remaining = max(0, min(MAX_UINT32, answer.remaining))
        before = limit.requests_per_unit - remaining
        if not over:
            before -= check.hits
        self._record(check, limit, before, over)
        status.limit_remaining = 0 if over else remaining
        status.code = OVER_LIMIT if over and not limit.shadow_mode else OK

    def _record(self, check: Check, limit: Limit, before: int, over: bool) -> None:
        stats = self._limit_stats(check.match.stats_key)
        near = near_threshold(limit.requests_per_unit, self._near_ratio)
        record(stats, limit.requests_per_unit, before, check.hits, over, limit.shadow_mode, near)
        if over and limit.shadow_mode:
            self.stats.shadow_over_limit += 1
            self._log.warning("envoy: shadow_mode limit %r over limit", limit.name, key="shadow")
        elif over:
            self.stats.over_limit += 1

    def _limit_stats(self, key: str) -> LimitStats:
        stats = self.limit_stats.get(key)
        if stats is None:
            stats = self.limit_stats[key] = LimitStats()
        return stats

    def _add_headers(
        self,
        response: rls_pb2.RateLimitResponse,
        refusing: list[bool],
        by_index: Mapping[int, tuple[Check, RateLimitResponse]],
        now: int,
    ) -> None:
        chosen = speaking_status(response.statuses, refusing)
        if chosen is None or chosen not in by_index:
            return
        reset_s = ceil_s(by_index[chosen][0].window_end - now)
        for name, value in rate_limit_headers(response.statuses[chosen], reset_s, self.settings):
            response.response_headers_to_add.add(key=name, value=value)


def add_to_server(
    server: GrpcServer,
    limiter: RateLimiter,
    config: EnvoyConfig | None,
    clock: Callable[[], int] = epoch_ms,
    *,
    response_headers: bool | None = None,
    settings: EnvoySettings | None = None,
    metrics: ClusterMetrics | None = None,
    servicer: RateLimitServicer | None = None,
) -> RateLimitServicer:
    """Serve ShouldRateLimit on ``server``; the servicer is returned for its stats/config.

    ``settings`` default to envoyproxy/ratelimit's environment variables (settings.py);
    ``response_headers`` overrides their LIMIT_RESPONSE_HEADERS_ENABLED. The counters
    are exported on ``metrics`` (by default those of ``limiter`` when it is a node).

    The handler is registered by hand (not with the generated helper) so that bytes that do
    not decode reach the servicer as None and are counted and logged like other bad input.
    ``servicer``: one built already (a subclass), served instead of a new one.
    """
    if metrics is None and isinstance(limiter, Node):
        metrics = limiter.metrics
    if servicer is None:
        servicer = RateLimitServicer(
            limiter,
            config,
            clock,
            response_headers=response_headers,
            settings=settings,
            metrics=metrics,
        )
    decide = getattr(limiter, "answer_here", None) if servicer.fast_path else None
    if isinstance(server, ThreadedServer | NativeServer) and decide is not None:
        # checks the node decides alone are answered on the gRPC thread (see threaded.py)
        threaded = grpc.unary_unary_rpc_method_handler(
            fast_or_bridged(
                lambda request, context: servicer.answer_here(request, decide),
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
