"""A reverse-proxy gatekeeper in front of any HTTP service (the seed's nginx-module role).

The HTTP side is smockron/gatekeeper/_http1.py (asyncio protocols, llhttp parsing):
bodies are streamed both ways, upstream connections are kept alive and reused,
hop-by-hop headers are dropped and ``X-Forwarded-For`` is appended. Here: what the
gatekeeper says about each request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from smockron.errors import ConfigError
from smockron.gatekeeper._asyncio import AsyncGatekeeper
from smockron.gatekeeper._decider import Decision, Verdict
from smockron.gatekeeper._http1 import ClientConnection, Http1Proxy, Request
from smockron.gatekeeper.httpgate import HttpGate
from smockron.httpguard import HEADER_TIMEOUT_S, ConnectionGuard
from smockron.observe import CountersCollector, ObserveServer, Readiness, bound, serve
from smockron.observe.layouts import GATEKEEPER
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.gatekeeper.proxy")

DECISION_HEADER: Final = "X-Smockron-Decision"
ACCEPT, DELAY = Verdict.ACCEPT, Verdict.DELAY


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
        self.upstream_timeout_s = upstream_timeout_s
        self._extra = {
            v: (f"{DECISION_HEADER}: {v.value}\r\n".encode() if decision_header else b"")
            for v in Verdict
        }
        self._accepted = self._extra[Verdict.ACCEPT]  # per request: no enum hash
        self._http: Http1Proxy | None = None
        self._delays: set[asyncio.Task[None]] = set()
        self.bad_requests = 0
        self._bad_log = RateLimitedLog(log)
        self.metrics = metrics
        self.listener: ObserveServer | None = None
        self.guard = ConnectionGuard(
            log,
            header_timeout_s=header_timeout_s,
            max_connections=max_connections,
            fds_per_connection=2,
        )

    def stats(self) -> dict[str, int]:
        """The gatekeeper's counters plus requests let through on errors."""
        return {
            **self.gatekeeper.stats(),
            "fail_open_errors": self.gate.errors,
            "bad_requests": self.bad_requests,
            **self.guard.stats(),
        }

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port``; the gatekeeper and upstream pool start here too."""
        self.gatekeeper.start()
        http = Http1Proxy(
            self.upstream,
            self._on_request,
            self.guard,
            log,
            upstream_timeout_s=self.upstream_timeout_s,
            bad_request=self._bad_request,
        )
        await http.start(host, port)
        self._http = http
        log.info(
            "gatekeeper proxy on %s:%d -> %s (at most %d connections, headers within %g s)",
            host,
            port,
            self.upstream,
            self.guard.max_connections,
            self.guard.header_timeout_s,
        )
        if self.metrics:
            self.listener = self.observe(self.metrics)

    def observe(self, address: str) -> ObserveServer:
        """/metrics (the gatekeeper's counters), /healthz, /readyz (listening, master heard)."""
        registry = CollectorRegistry()
        registry.register(CountersCollector(GATEKEEPER, self.stats))
        readiness = Readiness(
            {
                "listening": bound(lambda: self._http is not None, "HTTP listener"),
                "master": self.gatekeeper.master_problem,
            }
        )
        return serve(address, readiness, registry)

    async def close(self) -> None:
        """Stop listening; requests in progress (delays included) finish first."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        await self.gatekeeper.aclose()

    def _bad_request(self, what: str) -> None:
        self.bad_requests += 1
        self._bad_log.warning("malformed HTTP request: %s", what.splitlines()[0] if what else "")

    def _on_request(self, conn: ClientConnection, req: Request) -> None:
        # gate.target and gatekeeper.check, a call less each: this runs for every request
        try:
            target = self.gate.resolve(req)
        except Exception as exc:
            self.gate.fail_open(exc)
            target = None
        if target is None:
            conn.forward(req, self._accepted)
            return
        domain, identifier, loginfo = target
        try:
            decision = self.gatekeeper.decide(domain, identifier, None, loginfo, True)
        except Exception as exc:  # fail-permissive, even against our own bugs
            self.gate.fail_open(exc)
            conn.forward(req, self._accepted)
            return
        verdict = decision.verdict
        if verdict is ACCEPT:
            conn.forward(req, self._accepted)
        elif verdict is DELAY:
            task = asyncio.get_running_loop().create_task(self._delay(conn, req, decision, target))
            req.task = task
            self._delays.add(task)
            task.add_done_callback(self._delays.discard)
        else:
            self._reject(conn, req, decision)

    async def _delay(
        self,
        conn: ClientConnection,
        req: Request,
        decision: Decision,
        target: tuple[bytes, bytes, bytes | None],
    ) -> None:
        domain, identifier, loginfo = target
        if await self.gatekeeper.wait_out(decision, domain, identifier, loginfo):
            req.task = None
            conn.forward(req, self._extra[Verdict.DELAY])
            return
        # the client connection stayed open; the upstream has not seen it yet
        req.task = None
        self._reject(conn, req, decision._replace(verdict=Verdict.REJECT))
        conn.flush()

    def _reject(self, conn: ClientConnection, req: Request, decision: Decision) -> None:
        rejection = self.gate.reject(decision.wait_ms, req)
        headers = b"".join(
            b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in rejection.headers
            if name != "content-length"
        )
        conn.respond(
            req,
            rejection.status_line.encode(),
            headers,
            rejection.body,
            self._extra[Verdict.REJECT],
        )
