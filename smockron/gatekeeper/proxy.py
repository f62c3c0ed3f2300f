"""A reverse-proxy gatekeeper in front of any HTTP service (the seed's nginx-module role).

aiohttp on both sides: bodies are streamed both ways, upstream connections are kept
alive and reused, hop-by-hop headers are dropped and ``X-Forwarded-For`` is appended.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from smockron.errors import ConfigError
from smockron.gatekeeper._asyncio import AsyncGatekeeper
from smockron.gatekeeper._decider import Verdict
from smockron.gatekeeper.httpgate import HttpGate
from smockron.gatekeeper.identify import RequestInfo
from smockron.httpguard import HEADER_TIMEOUT_S, ConnectionGuard, GuardedSite
from smockron.httplog import ServerLog
from smockron.observe import CountersCollector, ObserveServer, Readiness, bound, serve
from smockron.observe.layouts import GATEKEEPER

log = logging.getLogger("smockron.gatekeeper.proxy")

HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
DECISION_HEADER: Final = "X-Smockron-Decision"
_CHUNK: Final = 64 * 1024


def end_to_end(headers: Iterable[tuple[str, str]], connection: str | None) -> CIMultiDict[str]:
    """Headers minus hop-by-hop ones, including any named in ``Connection``."""
    drop = set(HOP_BY_HOP)
    if connection:
        drop.update(token.strip().lower() for token in connection.split(","))
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers:
        if name.lower() not in drop:
            out.add(name, value)
    return out


def request_info(request: web.Request) -> RequestInfo:
    headers = request.headers

    def lookup(name: str) -> str | None:
        values = headers.getall(name, ())
        return ", ".join(values) if values else None

    return RequestInfo(request.remote, request.method, request.path, lookup)


class GatekeeperProxy:
    """Forward requests to ``upstream`` after the gatekeeper admits them."""

    def __init__(
        self,
        upstream: str,
        gate: HttpGate,
        gatekeeper: AsyncGatekeeper,
        *,
        decision_header: bool = False,
        upstream_timeout_s: float = 60.0,
        metrics: str | None = None,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        max_connections: int | None = None,
    ) -> None:
        """``header_timeout_s``, ``max_connections``: see smockron/httpguard.py (the cap
        defaults to what the descriptor limit allows, two descriptors a connection)."""
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"--upstream {upstream!r} must be an http:// or https:// URL")
        self.upstream = upstream.rstrip("/")
        self.gate = gate
        self.gatekeeper = gatekeeper
        self.decision_header = decision_header
        self.timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=5, sock_read=upstream_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.server_log = ServerLog(log)
        self.metrics = metrics
        self.listener: ObserveServer | None = None
        self.guard = ConnectionGuard(log, header_timeout_s=header_timeout_s,
                                     max_connections=max_connections,
                                     fds_per_connection=2)  # fmt: skip

    def stats(self) -> dict[str, int]:
        """The gatekeeper's counters plus requests let through on errors."""
        return {
            **self.gatekeeper.stats(),
            "fail_open_errors": self.gate.errors,
            "bad_requests": self.server_log.bad_requests,
            **self.guard.stats(),
        }

    def app(self) -> web.Application:
        app = web.Application(client_max_size=0, middlewares=[self.guard.middleware])
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port``; the gatekeeper and upstream pool start here too."""
        self.gatekeeper.start()
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=self.timeout
        )
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, logger=self.server_log
        )
        await self._runner.setup()
        await GuardedSite(self._runner, host, port, self.guard, reuse_address=True).start()
        log.info("gatekeeper proxy on %s:%d -> %s (at most %d connections, headers within "
                 "%g s)", host, port, self.upstream, self.guard.max_connections,
                 self.guard.header_timeout_s)  # fmt: skip
        if self.metrics:
            self.listener = self.observe(self.metrics)

    def observe(self, address: str) -> ObserveServer:
        """/metrics (the gatekeeper's counters), /healthz, /readyz (listening, master heard)."""
        registry = CollectorRegistry()
        registry.register(CountersCollector(GATEKEEPER, self.stats))
        readiness = Readiness(
            {
                "listening": bound(lambda: self._runner is not None, "HTTP listener"),
                "master": self.gatekeeper.master_problem,
            }
        )
        return serve(address, readiness, registry)

    async def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.gatekeeper.aclose()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        req = request_info(request)
        target = self.gate.target(req)
        verdict = Verdict.ACCEPT
        if target is not None:
            domain, identifier, loginfo = target
            try:
                decision = self.gatekeeper.check(domain, identifier, None, loginfo)
            except Exception as exc:  # fail-permissive, even against our own bugs
                self.gate.fail_open(exc)
                return await self._forward(request, verdict)
            verdict = decision.verdict
            if verdict is Verdict.DELAY and not await self.gatekeeper.wait_out(
                decision, domain, identifier, loginfo
            ):  # the client connection stayed open; the upstream has not seen it yet
                verdict = Verdict.REJECT
                decision = decision._replace(verdict=verdict)
            if verdict is Verdict.REJECT:
                rejection = self.gate.reject(decision.wait_ms, req)
                headers = CIMultiDict(rejection.headers)
                if self.decision_header:
                    headers[DECISION_HEADER] = verdict.value
                return web.Response(status=rejection.status, headers=headers, body=rejection.body)
        return await self._forward(request, verdict)

    async def _forward(self, request: web.Request, verdict: Verdict) -> web.StreamResponse:
        assert self._session is not None, "GatekeeperProxy.start() was not awaited"
        headers = end_to_end(request.headers.items(), request.headers.get("Connection"))
        headers.popall("Host", None)
        peer = request.remote or "unknown"
        prior = request.headers.getall("X-Forwarded-For", ())
        headers["X-Forwarded-For"] = ", ".join([*prior, peer])
        headers.setdefault("X-Forwarded-Host", request.host)
        headers.setdefault("X-Forwarded-Proto", request.scheme)
        data = request.content if request.body_exists else None
        try:
            async with self._session.request(
                request.method,
                self.upstream + request.rel_url.raw_path_qs,
                headers=headers,
                data=data,
                allow_redirects=False,
            ) as upstream:
                return await self._relay(request, upstream, verdict)
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.warning("upstream %s failed: %r", self.upstream, exc)
            return web.Response(status=502, text="502 Bad Gateway: upstream unavailable\n")

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, verdict: Verdict
    ) -> web.StreamResponse:
        headers = end_to_end(upstream.headers.items(), upstream.headers.get("Connection"))
        if self.decision_header:
            headers[DECISION_HEADER] = verdict.value
        response = web.StreamResponse(
            status=upstream.status, reason=upstream.reason, headers=headers
        )
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_chunked(_CHUNK):
                await response.write(chunk)
        except (TimeoutError, aiohttp.ClientError) as exc:
            # headers are gone already: cut the connection so the client sees the truncation
            log.warning("upstream %s failed mid-body: %r", self.upstream, exc)
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response
