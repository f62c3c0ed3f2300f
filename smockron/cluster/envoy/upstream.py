"""A node in envoyproxy/ratelimit mode: upstream's files, ports, probes, stats and counts.

``UpstreamFront`` is what ``smockron cluster`` runs instead of ``--envoy-config`` when the
environment is upstream's (upstream_env.py says when). Beyond the Envoy front on the
gRPC port it serves what upstream serves:

* the descriptor files of the runtime directory, every file under
  ``RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`` (subdirectories too, whatever
  the extension, dot files unless ``RUNTIME_IGNOREDOTFILES``), reloaded when they change;
  files that do not load at start leave the node serving, every call answered
  "no rate limit configuration loaded" until a set that loads is written;
* ``HOST:PORT``: ``GET /healthcheck`` (200 ``OK`` / 500) and ``POST /json`` (the request
  in protobuf JSON; 200, 429 OVER_LIMIT, 500 UNKNOWN code, 400 for a bad body or a call
  that fails); ``DEBUG_HOST:DEBUG_PORT``: ``/`` (the list), ``/rlconfig`` (the loaded
  domains) and ``/stats`` (the counters);
* the gRPC health service on the gRPC port: ``ratelimit`` is SERVING when every component
  is healthy (Redis answered, with the Redis backend; a config with a domain is loaded,
  with ``HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED``; not stopping), ``""`` always;
* statsd counters, timers and gauges (statsd_sink.py), the Redis backend
  (redis_cache.py), ``LOG_LEVEL`` and ``LOG_FORMAT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format
from grpc_health.v1 import health_pb2

from smockron import runtime
from smockron.cluster.envoy.config import DescriptorNode, EnvoyConfig, load_config
from smockron.cluster.envoy.pb import rls_pb2
from smockron.cluster.envoy.redis_pool import pool_counters, pool_gauges
from smockron.cluster.envoy.reload import ConfigReloader
from smockron.cluster.envoy.service import RateLimitServicer, ServiceError, add_to_server
from smockron.cluster.envoy.settings import EnvoySettings
from smockron.cluster.envoy.stats import EnvoyStatsCollector, ServerStats
from smockron.cluster.envoy.statsd_sink import (
    CacheGauges,
    StatsdSink,
    counters,
    gauges,
    tag_suffix,
)
from smockron.cluster.envoy.upstream_env import UpstreamSettings, refusals, warnings
from smockron.cluster.node import Node
from smockron.cluster.transports import GrpcServer
from smockron.errors import ConfigError
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.cluster.envoy")

HEALTH_SERVICE = "grpc.health.v1.Health"
SERVICE_NAME = "ratelimit"

_LOG_LEVELS = {
    "trace": "DEBUG",
    "debug": "DEBUG",
    "info": "INFO",
    "warn": "WARNING",
    "warning": "WARNING",
    "error": "ERROR",
    "fatal": "CRITICAL",
    "panic": "CRITICAL",
}


def apply_logging(settings: UpstreamSettings, env: Mapping[str, str]) -> None:
    """``LOG_LEVEL`` (logrus' names) and ``LOG_FORMAT`` (``json`` or text), unless
    smockron's own ``SMOCKRON_LOG_LEVEL`` / ``SMOCKRON_LOG_FORMAT`` chose."""
    level = None
    if settings.log_level and "SMOCKRON_LOG_LEVEL" not in env:
        level = _LOG_LEVELS.get(settings.log_level.lower())
        if level is None:
            raise ConfigError(f"LOG_LEVEL: Could not parse log level {settings.log_level!r}")
    fmt = None
    if settings.log_format and "SMOCKRON_LOG_FORMAT" not in env:
        fmt = "json" if settings.log_format.lower() == "json" else "text"
    if level is not None or fmt is not None:
        runtime.configure_logging(level, fmt)


def runtime_files(settings: UpstreamSettings) -> list[Path]:
    """The descriptor files of the runtime directory, sorted (see the module's docstring)."""
    root = settings.config_dir
    files: list[Path] = []
    if not root.is_dir():
        return files
    for directory, dirnames, filenames in os.walk(root, followlinks=True):
        if settings.runtime_ignore_dotfiles:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        dirnames.sort()
        for name in sorted(filenames):
            if settings.runtime_ignore_dotfiles and name.startswith("."):
                continue
            files.append(Path(directory, name))
    return files


class Health:
    """Upstream's HealthChecker: healthy when every component is."""

    def __init__(self, redis: bool, config: bool) -> None:
        self.components = {"sigterm": True}
        if redis:
            self.components["redis"] = False
        if config:
            self.components["config"] = False

    @property
    def ok(self) -> bool:
        return all(self.components.values())

    def set(self, component: str, healthy: bool) -> None:
        if component in self.components:
            self.components[component] = healthy

    async def Check(
        self,
        request: health_pb2.HealthCheckRequest | None,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> health_pb2.HealthCheckResponse:
        if request is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed HealthCheckRequest")
            raise AssertionError  # abort raises
        serving = health_pb2.HealthCheckResponse.SERVING
        if request.service == "":
            return health_pb2.HealthCheckResponse(status=serving)
        if request.service != SERVICE_NAME:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        status = serving if self.ok else health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)


def _parse_health(data: bytes) -> health_pb2.HealthCheckRequest | None:
    try:
        return health_pb2.HealthCheckRequest.FromString(data)
    except Exception:  # DecodeError: hostile bytes
        return None


class UpstreamFront:
    """The Envoy front and everything around it, in envoyproxy/ratelimit mode. The same
    interface as run.EnvoyFront (called with the gRPC server, ``start``, ``close``,
    ``reload``)."""

    def __init__(
        self,
        settings: UpstreamSettings,
        reload_interval: float,
        env: Mapping[str, str],
        response_headers: bool | None = None,
    ) -> None:
        """``response_headers``: ``--envoy-response-headers`` (or LIMIT_RESPONSE_HEADERS_ENABLED)
        as the command line resolved it."""
        refused = refusals(env)
        if refused:
            raise ConfigError(
                "envoyproxy/ratelimit settings smockron does not support: " + "; ".join(refused)
            )
        for line in warnings(env):
            log.warning("envoy: %s", line)
        self.settings = settings
        self.reload_interval = reload_interval
        self.envoy_settings = EnvoySettings.from_env(env)
        if response_headers is not None:
            self.envoy_settings = dataclasses.replace(
                self.envoy_settings, response_headers=response_headers
            )
        self.health = Health(
            redis=settings.backend_type == "redis",
            config=settings.healthy_with_at_least_one_config_loaded,
        )
        self.config: EnvoyConfig | None = None
        self._load_error = ""
        files = runtime_files(settings)
        log.debug(
            "envoy: runtime directory %s: %s",
            settings.config_dir,
            ", ".join(str(f) for f in files) or "no file",
        )
        try:
            self.config = load_config(files)
        except ConfigError as exc:
            self._load_error = str(exc)
            log.error("envoy: no rate limit configuration loaded: %s", exc)
        self.servicer: RateLimitServicer | None = None
        self.server_stats = ServerStats(settings.prometheus_response_time_as_milliseconds)
        """Upstream's ``ratelimit_server.<method>`` stats of the gRPC calls."""
        self._reloader: ConfigReloader | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._runners: list[web.AppRunner] = []
        self._metrics: Any = None
        self._node: Node | None = None
        self._log = RateLimitedLog(log)

    def facts(self) -> dict[str, str]:
        s = self.settings
        return {
            "envoy": "envoyproxy/ratelimit",
            "runtime": str(s.config_dir),
            "backend": s.backend_type,
            "envoy_http": s.http_address,
            "envoy_debug": s.debug_address,
        }

    # -- on the gRPC server (ClusterServer's extension) ------------------------------------

    def __call__(self, server: GrpcServer, node: Node) -> None:
        self._node = node
        servicer = self._build_servicer(node)
        servicer.server_stats = self.server_stats
        add_to_server(server, node, self.config, servicer=servicer)
        if self.config is None:
            servicer.stats.config_errors += 1
        self._on_load(self.config)
        self.servicer = servicer
        node.metrics.registry.register(EnvoyStatsCollector(servicer.stats))
        self._reloader = ConfigReloader(
            servicer, lambda: runtime_files(self.settings), self.reload_interval, self._on_load
        )
        check = grpc.unary_unary_rpc_method_handler(
            self._check,
            request_deserializer=_parse_health,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(HEALTH_SERVICE, {"Check": check}),)
        )

    async def _check(
        self,
        request: health_pb2.HealthCheckRequest | None,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> health_pb2.HealthCheckResponse:
        """The health ``Check``, counted and timed as upstream's interceptor does."""
        start = time.perf_counter()
        try:
            return await self.health.Check(request, context)
        finally:
            if request is not None:
                self.server_stats.record("Check", time.perf_counter() - start)

    @property
    def local_cache(self) -> CacheGauges | None:
        """The Redis backend's local cache (``LOCAL_CACHE_SIZE_IN_BYTES``), if any."""
        from smockron.cluster.envoy.redis_cache import RedisRateLimitServicer

        servicer = self.servicer
        return servicer.local_cache if isinstance(servicer, RedisRateLimitServicer) else None

    def _build_servicer(self, node: Node) -> RateLimitServicer:
        common: dict[str, Any] = {"settings": self.envoy_settings, "metrics": node.metrics}
        if self.settings.backend_type == "redis":
            from smockron.cluster.envoy.redis_cache import build_redis_servicer

            return build_redis_servicer(node, self.config, self.settings, **common)
        return RateLimitServicer(node, self.config, **common)

    def _on_load(self, config: EnvoyConfig | None) -> None:
        self.health.set("config", config is not None and bool(config.domains))

    # -- listeners and tasks ---------------------------------------------------------------

    async def start(self) -> None:
        """The HTTP and debug listeners, statsd and the Redis probe (after the gRPC port)."""
        s = self.settings
        await self._serve(self._http_app(), s.host, s.port, "HTTP")
        await self._serve(self._debug_app(), s.debug_host, s.debug_port, "debug HTTP")
        loop = asyncio.get_running_loop()
        if self._reloader is not None and self.reload_interval > 0:
            self._tasks.append(loop.create_task(self._reloader.run()))
        if s.use_statsd and not s.disable_stats and self.servicer is not None:
            sink = StatsdSink(
                self.servicer,
                s.statsd_host,
                s.statsd_port,
                s.extra_tags,
                s.stats_flush_interval_s,
                local_cache=self.local_cache,
                pools=getattr(self.servicer, "pool_stats", None),
            )
            self._tasks.append(loop.create_task(sink.run()))
            log.info(
                "envoy: statsd counters to %s:%d every %gs",
                s.statsd_host,
                s.statsd_port,
                s.stats_flush_interval_s,
            )
        if s.use_prometheus and self._node is not None:
            from smockron.cluster.transports.http import observe

            self._metrics = observe(self._node, s.prometheus_addr)
        if s.backend_type == "redis":
            self._tasks.append(loop.create_task(self._watch_redis()))

    async def _serve(self, app: web.Application, host: str, port: int, what: str) -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            raise OSError(f"while starting {what} listener on {host}:{port}: {exc}") from None
        log.warning("Listening for %s on '%s:%d'", what, host, port)

    async def _watch_redis(self) -> None:
        """Marks Redis healthy once it answers (upstream waits for it at start); with
        ``REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`` keeps checking and fails the health
        check while it does not answer."""
        from smockron.cluster.envoy.redis_cache import RedisRateLimitServicer

        servicer = self.servicer
        if not isinstance(servicer, RedisRateLimitServicer):
            return
        delay = 0.1
        while True:
            healthy = await servicer.ping()
            self.health.set("redis", healthy)
            if healthy and not self.settings.redis_health_check_active_connection:
                return
            await asyncio.sleep(delay if not healthy else 1.0)
            delay = min(delay * 2, 5.0)

    def stopping(self) -> None:
        """SIGTERM: unhealthy from now on, while calls are still served (upstream's
        ``sigterm`` component; with GUBER_GRACEFUL_TERMINATION_DELAY_SEC, probes see it
        before the ports close)."""
        self.health.set("sigterm", False)

    async def close(self) -> None:
        self.health.set("sigterm", False)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in self._runners:
            await runner.cleanup()
        if self._metrics is not None:
            self._metrics.close()
        closer = getattr(self.servicer, "close", None)
        if closer is not None:
            await closer()

    def reload(self) -> None:
        """SIGHUP: check the runtime directory now."""
        if self._reloader is not None and not self._reloader.check():
            log.info("envoy: SIGHUP: the runtime directory is unchanged")

    # -- HTTP ------------------------------------------------------------------------------

    def _http_app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_get("/healthcheck", self._healthcheck)
        app.router.add_route("*", "/json", self._json)
        return app

    async def _healthcheck(self, request: web.Request) -> web.Response:
        if self.health.ok:
            return web.Response(text="OK")
        return web.Response(status=500)

    async def _json(self, request: web.Request) -> web.Response:
        """Upstream's ``NewJsonHandler``."""
        servicer = self.servicer
        if servicer is None:
            return _plain(500)
        body = await request.read()
        try:
            message = json_format.Parse(body, rls_pb2.RateLimitRequest())
        except (json_format.ParseError, ValueError, RecursionError) as exc:
            servicer.stats.json_malformed += 1
            self._log.warning("envoy: /json: %s", str(exc)[:200], key="json")
            return _plain(400)
        try:
            response = await servicer.decide(message)
        except ServiceError as exc:
            self._log.warning("envoy: /json: %s", exc.message, key="json-call")
            return _plain(400)
        text = json.dumps(json_format.MessageToDict(response), separators=(",", ":"))
        status = 200
        if response.overall_code == rls_pb2.RateLimitResponse.UNKNOWN:
            status = 500
        elif response.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT:
            status = 429
        return web.Response(status=status, text=text, content_type="application/json")

    def _debug_app(self) -> web.Application:
        endpoints = {
            "/rlconfig": "print out the currently loaded configuration for debugging",
            "/stats": "print out stats",
        }

        async def index(request: web.Request) -> web.Response:
            return web.Response(text="".join(f"{k}: {v}\n" for k, v in sorted(endpoints.items())))

        async def rlconfig(request: web.Request) -> web.Response:
            config = self.servicer.config if self.servicer is not None else None
            if config is None:
                return web.Response(text="")
            return web.Response(text="".join(_dump(config)))

        async def stats(request: web.Request) -> web.Response:
            if self.servicer is None:
                return web.Response(text="")
            values = counters(self.servicer, self.settings.extra_tags)
            values.update(gauges(self.local_cache, self.settings.extra_tags))
            pools = getattr(self.servicer, "pool_stats", {})
            suffix = tag_suffix(self.settings.extra_tags)
            values.update(pool_counters(pools, suffix) | pool_gauges(pools, suffix))
            return web.Response(text="".join(f"{k}: {v}\n" for k, v in sorted(values.items())))

        app = web.Application()
        app.router.add_get("/", index)
        app.router.add_get("/rlconfig", rlconfig)
        app.router.add_get("/stats", stats)
        return app


def _plain(status: int) -> web.Response:
    """Go's ``http.Error``: the status text, a newline, text/plain."""
    return web.Response(
        status=status,
        text=_REASONS[status] + "\n",
        content_type="text/plain",
        charset="utf-8",
    )


_REASONS = {400: "Bad Request", 500: "Internal Server Error"}


def _dump(config: EnvoyConfig) -> Iterator[str]:
    """One line per limit: ``<domain.key_value...>: unit=<UNIT> requests_per_unit=<n>``."""

    def walk(prefix: str, node: DescriptorNode) -> Iterator[str]:
        if node.limit is not None:
            limit = node.limit
            if limit.unlimited:
                yield f"{prefix}: unlimited\n"
            else:
                yield (
                    f"{prefix}: unit={limit.unit.upper()} "
                    f"requests_per_unit={limit.requests_per_unit}"
                    f"{', shadow_mode: true' if limit.shadow_mode else ''}\n"
                )
        for name, child in node.children.items():
            yield from walk(f"{prefix}.{name}", child)

    for domain, root in sorted(config.domains.items()):
        yield from walk(domain, root)
