"""ASGI middleware under a real uvicorn, WSGI middleware under a real waitress."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
from flask import Flask
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from smockron.gatekeeper.asgi import SmockronMiddleware
from smockron.gatekeeper.identify import header
from smockron.gatekeeper.wsgi import SmockronWSGIMiddleware
from smockron.wire.codec import ACCEPTED, DELAYED, REJECTED
from tests.gatekeeper.conftest import MasterSockets, wall_ms
from tests.gatekeeper.servers import uvicorn_server, waitress_server
from tests.support import wait_for


def starlette_app() -> Starlette:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"hello {request.url.path}")

    return Starlette(routes=[Route("/{path:path}", hello)])


def flask_app() -> Flask:
    app = Flask("t")

    @app.route("/", defaults={"path": ""})
    @app.route("/<path:path>")
    def hello(path: str) -> str:
        return f"hello /{path}"

    return app


def _subscribed(master: MasterSockets, get: Callable[[str], httpx.Response]) -> None:
    """Wait until the gatekeeper hears control (a probe identifier gets rejected) and the
    master hears accounting (the probe's message arrives): a PUB socket drops messages
    until the other side's subscription has reached it, a moment after connecting."""
    until = wall_ms() + 60_000

    def probe() -> bool:
        master.publish("api", b"probe", until)
        return get("probe").status_code == 503 and bool(master.drain(0.1))

    wait_for(probe, 10, 0.1)
    master.drain(0.1)


def api_options(master: MasterSockets, max_delay_ms: int = 1000) -> dict[str, Any]:
    """The middlewares' options here: /api is the "api" domain, clients told by
    X-Client."""
    return {
        "domain": {"/api": "api"},
        "accounting": master.accounting_addr,
        "control": master.control_addr,
        "identify": header("x-client"),
        "max_delay_ms": max_delay_ms,
    }


def _exercise(master: MasterSockets, port: int) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

        def get(who: str, **headers: str) -> httpx.Response:
            return client.get("/api/x", headers={"x-client": who, **headers})

        _subscribed(master, get)
        ok = get("alice", **{"user-agent": "pytest-agent"})
        assert ok.status_code == 200 and ok.text == "hello /api/x"
        msg = master.recv()
        assert (msg.status, msg.identifier) == (ACCEPTED, b"alice")
        assert msg.loginfo is not None and b"pytest-agent" in msg.loginfo

        master.publish("api", b"bob", wall_ms() + 400)
        time.sleep(0.1)
        t0 = time.monotonic()
        delayed = get("bob")
        assert delayed.status_code == 200 and time.monotonic() - t0 >= 0.2
        assert master.recv().status == DELAYED

        master.publish("api", b"eve", wall_ms() + 3500)
        time.sleep(0.1)
        rejected = get("eve")
        assert rejected.status_code == 503
        assert rejected.headers["retry-after"] in ("3", "4")
        assert rejected.headers["content-type"].startswith("text/plain")
        problem = get("eve", accept="application/problem+json")
        assert problem.status_code == 503
        assert problem.headers["content-type"] == "application/problem+json"
        assert problem.json()["status"] == 503
        assert [m.status for m in master.drain(0.2)] == [REJECTED, REJECTED]

        free = client.get("/health", headers={"x-client": "eve"})
        assert free.status_code == 200  # not under any domain


def test_asgi_under_uvicorn(master: MasterSockets) -> None:
    app = SmockronMiddleware(starlette_app(), **api_options(master))
    with uvicorn_server(app) as port:
        _exercise(master, port)
    assert not app.gatekeeper.started or app.gatekeeper._pub is None  # closed at shutdown


def wsgi_app(master: MasterSockets, max_delay_ms: int) -> SmockronWSGIMiddleware:
    """The Flask app behind the WSGI middleware, clients told by X-Client, on /api."""
    return SmockronWSGIMiddleware(flask_app(), **api_options(master, max_delay_ms))


def test_wsgi_under_waitress(master: MasterSockets) -> None:
    app = wsgi_app(master, max_delay_ms=1000)
    try:
        with waitress_server(app) as port:
            _exercise(master, port)
    finally:
        app.close()


def test_asgi_429_and_no_master() -> None:
    from tests.support import free_ports

    a, c = free_ports(2)
    app = SmockronMiddleware(
        starlette_app(),
        domain="api",
        accounting=f"tcp://127.0.0.1:{a}",
        control=f"tcp://127.0.0.1:{c}",
        reject_status=429,
    )
    with uvicorn_server(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        for _ in range(20):
            assert client.get("/x").status_code == 200
        # the master has never existed: everything passes and drops are counted
        assert app.gatekeeper.counters.accounting_dropped == 20
        app.gatekeeper.decider.table.update(b"api", b"127.0.0.1", wall_ms() + 9000, wall_ms())
        r = client.get("/x")
        assert r.status_code == 429 and r.headers["retry-after"] in ("9", "8")


def test_failing_identify_callable_fails_open(master: MasterSockets) -> None:
    def broken(req: object) -> str:
        raise RuntimeError("identify bug")

    asgi = SmockronMiddleware(
        starlette_app(),
        domain="api",
        accounting=master.accounting_addr,
        control=master.control_addr,
        identify=broken,
    )
    wsgi = SmockronWSGIMiddleware(
        flask_app(),
        domain="api",
        accounting=master.accounting_addr,
        control=master.control_addr,
        identify=broken,
    )
    try:
        with uvicorn_server(asgi) as p1, waitress_server(wsgi) as p2:
            for port in (p1, p2):
                for _ in range(3):
                    assert httpx.get(f"http://127.0.0.1:{port}/x").status_code == 200
        assert asgi.gate.errors == 3 and wsgi.gate.errors == 3
    finally:
        wsgi.close()


async def test_asgi_non_http_scopes_pass_through() -> None:
    """A websocket is not rate-limited (only HTTP requests are), even for a held client."""
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    async def echo(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_text(await ws.receive_text())
        await ws.close()

    inner = Starlette(routes=[Route("/", starlette_app()), WebSocketRoute("/ws", echo)])
    app = SmockronMiddleware(inner, domain="api")  # no master at all
    base: dict[str, object] = {
        "path": "/",
        "query_string": b"",
        "headers": [],
        "client": ("192.0.2.9", 4000),
    }

    async def call(scope: dict[str, object], inbound: list[dict[str, object]]) -> list[Any]:
        sent: list[Any] = []

        async def receive() -> dict[str, object]:
            return inbound.pop(0)

        async def send(message: Any) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return sent

    http = {**base, "type": "http", "method": "GET", "http_version": "1.1"}
    request = [{"type": "http.request", "body": b"", "more_body": False}]
    try:
        assert (await call(http, list(request)))[0]["status"] == 200
        app.gatekeeper.decider.table.update(b"api", b"192.0.2.9", wall_ms() + 60_000, wall_ms())
        assert (await call(http, list(request)))[0]["status"] == 503
        ws = {**base, "type": "websocket", "path": "/ws", "subprotocols": []}
        sent = await call(
            ws, [{"type": "websocket.connect"}, {"type": "websocket.receive", "text": "ping"}]
        )
        assert [m["type"] for m in sent] == [
            "websocket.accept",
            "websocket.send",
            "websocket.close",
        ]
        assert sent[1]["text"] == "ping"
    finally:
        await app.gatekeeper.aclose()


def _concurrent(port: int, who: str, n: int) -> list[int]:
    """``n`` requests at once (threads, so a WSGI server's pool is busy too)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(_: int) -> int:
        with httpx.Client(timeout=10) as c:
            r = c.get(f"http://127.0.0.1:{port}/api/x", headers={"x-client": who})
            return r.status_code

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_asgi_first_line_from_its_own_rules_without_a_master() -> None:
    """No master to hear from: the configured rule alone holds a burst to it."""
    app = SmockronMiddleware(
        starlette_app(),
        domain={"/api": "api"},
        accounting="tcp://127.0.0.1:1",  # nothing there
        control="tcp://127.0.0.1:1",
        identify=header("x-client"),
        max_delay_ms=0,  # over the rule: rejected at once
        rules={"api": ["1/s:5"]},
    )
    with uvicorn_server(app) as port:
        statuses = _concurrent(port, "abuser", 30)
    assert statuses.count(200) in (5, 6)  # 6 if the burst outlasts one 1 s interval
    assert statuses.count(503) == 30 - statuses.count(200)


def test_wsgi_first_line_learned_from_the_master(master: MasterSockets) -> None:
    from smockron.core.rules import Rule
    from smockron.wire.codec import encode_rules

    app = wsgi_app(master, max_delay_ms=0)
    try:
        with waitress_server(app, threads=16) as port:

            def offered() -> bool:
                master.publish_raw(encode_rules("api", "history", (Rule(1.0, 4),)))
                return b"api" in app.gatekeeper.decider.lines

            wait_for(offered, 10, 0.1)
            statuses = _concurrent(port, "abuser", 16)
            assert statuses.count(200) in (4, 5)
            assert _concurrent(port, "newcomer", 3) == [200, 200, 200]
    finally:
        app.close()
