"""Pure ASGI middleware: works under Starlette, FastAPI or any ASGI server.

A delayed request waits with ``asyncio.sleep`` before the app sees it, the client's
connection held open; a rejected one is answered here and never reaches the app.
Non-HTTP scopes pass straight through; a lifespan shutdown closes the gatekeeper.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from smockron.gatekeeper.core import AsyncGatekeeper
from smockron.gatekeeper.httpgate import HttpGate, LogInfo, http_loginfo
from smockron.gatekeeper.identify import DomainOf, Identify, RequestInfo, peer_address
from smockron.gatekeeper.state import Verdict

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def request_info(scope: Scope) -> RequestInfo:
    """The identification view of an ASGI HTTP scope; headers are decoded on first use."""
    raw: list[tuple[bytes, bytes]] = scope.get("headers") or []
    table: dict[str, str] | None = None

    def lookup(name: str) -> str | None:
        nonlocal table
        if table is None:  # one pass over the headers, only if someone asks
            table = {}
            for k, v in raw:
                key, value = k.decode("latin-1"), v.decode("latin-1")
                table[key] = f"{table[key]}, {value}" if key in table else value
        return table.get(name)

    client = scope.get("client")
    peer = client[0] if client else None
    return RequestInfo(peer, scope.get("method", "GET"), scope.get("path", "/"), lookup)


class SmockronMiddleware:
    """Rate-limit an ASGI app through a Smockron master.

    Pass ``gatekeeper`` to share one :class:`AsyncGatekeeper` between apps, or the
    master's ``accounting`` and ``control`` addresses to make one here.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        domain: str | Mapping[str, str] | DomainOf,
        accounting: str | None = None,
        control: str | None = None,
        gatekeeper: AsyncGatekeeper | None = None,
        identify: Identify = peer_address,
        loginfo: LogInfo | None = http_loginfo,
        reject_status: int = 503,
        max_delay_ms: int = 5000,
        max_delayed: int = 1000,
        reject_sample: float = 1.0,
    ) -> None:
        self.app = app
        self.gate = HttpGate(domain, identify, loginfo, reject_status)
        self.gatekeeper = gatekeeper or AsyncGatekeeper(
            accounting,
            control,
            self.gate.domains,
            max_delay_ms=max_delay_ms,
            max_delayed=max_delayed,
            reject_sample=reject_sample,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        req = request_info(scope)
        target = self.gate.target(req)
        if target is None:
            await self.app(scope, receive, send)
            return
        try:
            decision = await self.gatekeeper.admit(*target)
        except Exception as exc:  # fail-permissive, even against our own bugs
            self.gate.fail_open(exc)
            await self.app(scope, receive, send)
            return
        if decision.verdict is not Verdict.REJECT:
            await self.app(scope, receive, send)
            return
        rejection = self.gate.reject(decision.wait_ms, req)
        await send(
            {
                "type": "http.response.start",
                "status": rejection.status,
                "headers": [(k.encode(), v.encode()) for k, v in rejection.headers],
            }
        )
        await send({"type": "http.response.body", "body": rejection.body})

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.gatekeeper.start()
            elif message["type"] == "lifespan.shutdown":
                await self.gatekeeper.aclose()
            return message

        return wrapped
