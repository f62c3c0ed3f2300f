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


class ASGIRequestInfo(RequestInfo):
    """The identification view of an ASGI HTTP scope, reading its raw header list.

    Headers are found by scanning the (short) list on demand: cheaper per request than
    building a closure or a dictionary, and this runs on every request.
    """

    __slots__ = ("_raw",)

    def __init__(self, scope: Scope) -> None:
        client = scope.get("client")
        super().__init__(
            client[0] if client else None, scope.get("method", "GET"), scope.get("path", "/")
        )
        self._raw: list[tuple[bytes, bytes]] = scope.get("headers") or []

    def header(self, name: str) -> str | None:
        key = name.encode("latin-1")
        values = [v for k, v in self._raw if k == key]
        if not values:
            return None
        return b", ".join(values).decode("latin-1")


def request_info(scope: Scope) -> RequestInfo:
    return ASGIRequestInfo(scope)


class SmockronMiddleware:
    """Rate-limit an ASGI app through a Smockron master.

    Pass ``gatekeeper`` to share one :class:`AsyncGatekeeper` between apps (its owner
    closes it), or the master's ``accounting`` and ``control`` addresses to make one
    here, closed at lifespan shutdown.
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
        self._owns_gatekeeper = gatekeeper is None  # a shared one is closed by its owner
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
        gatekeeper = self.gatekeeper
        try:
            if not gatekeeper.started:
                gatekeeper.start()
            # decide() rather than admit(): no coroutine unless there is a delay to sleep
            domain, identifier, loginfo = target
            decision = gatekeeper.decide(domain, identifier, None, loginfo)
        except Exception as exc:  # fail-permissive, even against our own bugs
            self.gate.fail_open(exc)
            await self.app(scope, receive, send)
            return
        if decision.verdict is Verdict.DELAY:
            await gatekeeper.wait_out(decision)
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
            elif message["type"] == "lifespan.shutdown" and self._owns_gatekeeper:
                await self.gatekeeper.aclose()
            return message

        return wrapped
