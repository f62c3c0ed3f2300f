"""ASGI middleware under a real uvicorn: the defaults' fast path, and delays that watch
the client (one that leaves never reaches the app; a body sent meanwhile arrives intact).

Clients are raw sockets, so a test controls exactly when bytes go out and when the
connection closes.
"""

from __future__ import annotations

import socket
import time

import pytest

from smockron.errors import ConfigError
from smockron.gatekeeper.asgi import (
    ASGIRequestInfo,
    Receive,
    Scope,
    Send,
    SmockronMiddleware,
    scope_loginfo,
)
from smockron.gatekeeper.httpgate import http_loginfo
from smockron.wire.codec import ACCEPTED
from tests.gatekeeper.conftest import MasterSockets, wall_ms
from tests.gatekeeper.servers import uvicorn_server
from tests.support import wait_for

PEER = b"127.0.0.1"


class EchoApp:
    """Records every request it is called with and answers with the body it read."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        more = True
        while more:
            message = await receive()
            assert message["type"] == "http.request", message
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.calls.append((scope["path"], body))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _middleware(master: MasterSockets, app: EchoApp) -> SmockronMiddleware:
    """The defaults: one fixed domain, the peer address, the seed's loginfo."""
    return SmockronMiddleware(
        app,
        domain="api",
        accounting=master.accounting_addr,
        control=master.control_addr,
        max_delay_ms=3000,
    )


def _delay_peer(master: MasterSockets, mw: SmockronMiddleware, ms: int) -> int:
    """Publish a DELAY_UNTIL for our address until the gatekeeper holds it."""
    wait_for(lambda: master.accepting() and mw.gatekeeper.master_connected, 10)
    until = wall_ms() + ms

    def held() -> bool:
        master.publish("api", PEER, until)
        return mw.gatekeeper.decider.table.until(b"api", PEER, wall_ms()) == until

    wait_for(held, 10, 0.05)
    return until


def _until_master_hears(master: MasterSockets, port: int, quiet_s: float = 0.1) -> None:
    """Probe until the master receives accounting, then drop what the probes sent.

    A connected PUB socket still drops messages until the master's subscription has
    reached it, a moment after the connection (ZeroMQ's slow joiner)."""

    def heard() -> bool:
        with _request(port, b"GET /probe HTTP/1.1\r\nHost: t\r\n\r\n") as sock:
            assert _response(sock)[0] == 200
        return bool(master.drain(quiet_s))

    wait_for(heard, 10, 0.05)
    master.drain(quiet_s)


def _request(port: int, head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head)
    return sock


def _response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the response head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(
        int(v)
        for k, _, v in (ln.partition(b":") for ln in lines[1:])
        if k.lower() == b"content-length"
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the response body"
        body += chunk
    return int(lines[0].split()[1]), body


def test_defaults_identify_the_peer_with_the_seed_loginfo(master: MasterSockets) -> None:
    app = EchoApp()
    mw = _middleware(master, app)
    with uvicorn_server(mw) as port:
        head = (
            b"GET /hi HTTP/1.1\r\nHost: t\r\nUser-Agent: probe/1.0\r\n"
            b"Referer: http://example.test/\r\n\r\n"
        )
        _until_master_hears(master, port)
        with _request(port, head) as sock:
            assert _response(sock)[0] == 200
        msg = master.recv()
    assert (msg.domain, msg.status, msg.identifier) == (b"api", ACCEPTED, PEER)
    assert msg.loginfo == b"ua=probe/1.0 referer=http://example.test/"


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"user-agent", b"curl/8")],
        [(b"referer", b"http://r/"), (b"user-agent", b""), (b"accept", b"*/*")],
        [(b"user-agent", b"a"), (b"user-agent", b"b"), (b"referer", b"x"), (b"referer", b"y")],
        [(b"user-agent", "caf\u00e9 \u00ff".encode("latin-1"))],  # not ASCII
        [(b"user-agent", b"x" * 2000)],  # capped
    ],
)
def test_scope_loginfo_matches_the_general_path(headers: list[tuple[bytes, bytes]]) -> None:
    scope = {"type": "http", "client": ("192.0.2.1", 1), "headers": headers}
    assert scope_loginfo(scope) == http_loginfo(ASGIRequestInfo(scope))


def test_client_gone_during_delay_never_reaches_the_app(master: MasterSockets) -> None:
    app = EchoApp()
    mw = _middleware(master, app)
    with uvicorn_server(mw) as port:
        until = _delay_peer(master, mw, 1500)
        sock = _request(port, b"GET /left HTTP/1.1\r\nHost: t\r\n\r\n")
        wait_for(lambda: mw.gatekeeper.decider.waiting == 1, 5)  # it is being delayed
        sock.close()
        wait_for(lambda: mw.abandoned == 1, 5)
        time.sleep(max(0, until - wall_ms()) / 1000 + 0.3)  # well past the delay
        assert app.calls == []
        assert mw.gatekeeper.decider.waiting == 0  # its slot was freed
        with _request(port, b"GET /after HTTP/1.1\r\nHost: t\r\n\r\n") as again:
            assert _response(again) == (200, b"")
        assert app.calls == [("/after", b"")]
    counters = mw.gatekeeper.counters
    assert (counters.delayed, counters.accepted) == (1, 1)


@pytest.mark.parametrize("size", [11, 300_000])  # within and beyond what is replayed
def test_delayed_post_body_arrives_intact(master: MasterSockets, size: int) -> None:
    app = EchoApp()
    mw = _middleware(master, app)
    body = bytes(i % 251 for i in range(size))
    with uvicorn_server(mw) as port:
        until = _delay_peer(master, mw, 800)
        t0 = time.monotonic()
        wait_s = (until - wall_ms()) / 1000
        head = b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size
        with _request(port, head + body[: size // 2]) as sock:
            wait_for(lambda: mw.gatekeeper.decider.waiting == 1, 5)
            time.sleep(0.2)
            sock.sendall(body[size // 2 :])  # the rest arrives during the delay
            status, echoed = _response(sock)
        assert time.monotonic() - t0 >= wait_s - 0.01  # it was held for its delay
    assert status == 200
    assert echoed == body
    assert app.calls == [("/upload", body)]
    assert mw.abandoned == 0


def test_flush_delay_gathers_accounting(master: MasterSockets) -> None:
    app = EchoApp()
    mw = SmockronMiddleware(
        app,
        domain="api",
        accounting=master.accounting_addr,
        control=master.control_addr,
        flush_delay_ms=400,
    )
    with uvicorn_server(mw) as port:
        _until_master_hears(master, port, quiet_s=0.6)
        with _request(port, b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n") as sock:
            assert _response(sock)[0] == 200
        t0 = time.monotonic()
        assert master.drain(0.15) == []  # still gathered
        msg = master.recv(2.0)
        assert msg.status == ACCEPTED and time.monotonic() - t0 >= 0.15
    with pytest.raises(ConfigError):
        SmockronMiddleware(app, domain="api", flush_delay_ms=5000)
