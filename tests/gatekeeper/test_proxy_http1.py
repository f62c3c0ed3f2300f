"""The proxy's HTTP/1.1 handling on raw sockets: HEAD, pipelining, HTTP/1.0 clients,
``Expect: 100-continue``, bodies delimited by the upstream closing, an upstream that
dies mid-body, stale pooled connections, and hostile bytes (bad chunked bodies, huge
heads, request smuggling, garbage) that never reach the upstream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from smockron.gatekeeper._asyncio import AsyncGatekeeper
from smockron.gatekeeper.httpgate import HttpGate
from smockron.gatekeeper.identify import header
from smockron.gatekeeper.proxy import GatekeeperProxy
from tests.support import free_ports


@dataclass
class RawBackend:
    """An upstream answering by path, recording the request heads it read."""

    port: int = 0
    heads: list[bytes] = field(default_factory=list)
    connections: int = 0
    server: asyncio.AbstractServer | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(
                    (int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length")),
                    0,
                )
                body = await reader.readexactly(length) if length else b""
                if any(x.lower() == "transfer-encoding: chunked" for x in lines):
                    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                        body += (await reader.readexactly(size + 2))[:-2]
                    await reader.readuntil(b"\r\n")
                if path == "/eof":  # no length: the body ends with the connection
                    writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end")
                    await writer.drain()
                    break
                if path == "/die":  # promises 100 bytes, sends 5 and dies
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello")
                    await writer.drain()
                    break
                if path == "/once":  # answers, then closes its kept-alive connection
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nonce")
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    break
                if path == "/sleep":  # answers after 0.6 s
                    await asyncio.sleep(0.6)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nslept")
                    await writer.drain()
                    continue
                if path == "/silent":  # never answers
                    await asyncio.sleep(30)
                    break
                if path == "/hops":  # hop-by-hop headers, some named by Connection
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nConnection: "
                        b"keep-alive, X-Hop\r\nX-Hop: secret\r\nX-End:kept\r\n"
                        b"Transfer-Encoding: chunked\r\nUpgrade: h2c\r\nX-Te: 1\r\n"
                        b"\r\n5\r\nhello\r\n0\r\n\r\n"
                    )
                    await writer.drain()
                    continue
                if path == "/interim":  # 103 Early Hints before the response
                    writer.write(
                        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    )
                    await writer.drain()
                    continue
                if path == "/garbage":
                    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
                    await writer.drain()
                    break
                payload = b"%s %s %d" % (lines[0].split(" ")[0].encode(), path.encode(), len(body))
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d"
                    b"\r\n\r\n" % len(payload)
                )
                if not lines[0].startswith("HEAD"):
                    writer.write(payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw_backend() -> AsyncIterator[RawBackend]:
    b = RawBackend()
    b.server = await asyncio.start_server(b.handle, "127.0.0.1", 0)
    b.port = b.server.sockets[0].getsockname()[1]
    try:
        yield b
    finally:
        b.server.close()


@pytest.fixture
async def proxy(raw_backend: RawBackend) -> AsyncIterator[tuple[GatekeeperProxy, int]]:
    """An in-process proxy; its gatekeeper has no master, so every request is accepted."""
    port, acc, ctl = free_ports(3)
    gk = AsyncGatekeeper(f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}", ["api"])
    p = GatekeeperProxy(
        f"http://127.0.0.1:{raw_backend.port}",
        HttpGate("api", header("X-Client")),
        gk,
        decision_header=True,
    )
    await p.start("127.0.0.1", port)
    try:
        yield p, port
    finally:
        await p.close()


async def exchange(port: int, data: bytes) -> bytes:
    """``data`` sent on a new connection; everything read until the proxy closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(-1), 5)
    finally:
        writer.close()


async def head_and_body(port: int, data: bytes) -> tuple[bytes, bytes]:
    """:func:`exchange`'s answer cut into its head and the rest."""
    head, _, body = (await exchange(port, data)).partition(b"\r\n\r\n")
    return head, body


async def test_head_has_no_body_and_keeps_the_connection(
    proxy: tuple[GatekeeperProxy, int],
) -> None:
    _, port = proxy
    out = await exchange(
        port,
        b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /g HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    first, _, rest = out.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200") and b"Content-Length: 9" in first
    assert rest.startswith(b"HTTP/1.1 200"), out  # no HEAD body before the next response
    assert rest.endswith(b"GET /g 0")
    assert b"X-Smockron-Decision: accept" in first


async def test_pipelined_requests_are_answered_in_order(
    proxy: tuple[GatekeeperProxy, int],
) -> None:
    _, port = proxy
    out = await exchange(
        port,
        b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        b"GET /3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    bodies = [part.split(b"\r\n\r\n")[-1] for part in out.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"GET /1 0", b"POST /2 3", b"GET /3 0"], out


async def test_http10_client_gets_a_close_delimited_body(
    proxy: tuple[GatekeeperProxy, int],
) -> None:
    _, port = proxy
    head, body = await head_and_body(port, b"GET /eof HTTP/1.0\r\n\r\n")
    assert b"Connection: close" in head and b"chunked" not in head.lower()
    assert body == b"to the end"
    # an HTTP/1.1 client gets the same body chunked, on a connection it may keep
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /eof HTTP/1.1\r\nHost: x\r\n\r\n")
    out = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
    writer.close()
    head, _, body = out.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    assert body == b"a\r\nto the end\r\n0\r\n\r\n"


async def test_response_hop_by_hop_headers_are_dropped(
    proxy: tuple[GatekeeperProxy, int],
) -> None:
    _, port = proxy
    head, body = await head_and_body(port, b"GET /hops HTTP/1.1\r\nConnection: close\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK"
    assert b"X-End:kept" in lines and b"X-Te: 1" in lines
    names = [line.split(b":")[0].lower() for line in lines[1:]]
    assert not {b"keep-alive", b"x-hop", b"upgrade"} & set(names), head
    assert names.count(b"transfer-encoding") == 1 and names.count(b"connection") == 1
    assert body == b"5\r\nhello\r\n0\r\n\r\n"


async def test_interim_responses_are_not_relayed(proxy: tuple[GatekeeperProxy, int]) -> None:
    _, port = proxy
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(2):  # and the kept-alive upstream connection serves the next one
        writer.write(b"GET /interim HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Link" not in head, head
        assert await reader.readexactly(2) == b"ok"
    writer.close()


async def test_expect_continue(proxy: tuple[GatekeeperProxy, int], raw_backend: RawBackend) -> None:
    _, port = proxy
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"PUT /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n")
    writer.write(b"Content-Length: 4\r\n\r\n")
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"data")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200")
    assert await reader.readexactly(9) == b"PUT /up 4"
    writer.close()
    assert b"expect" not in raw_backend.heads[-1].lower()  # the proxy answered it


async def test_upstream_dying_mid_body_cuts_the_client(
    proxy: tuple[GatekeeperProxy, int],
) -> None:
    _, port = proxy
    out = await exchange(port, b"GET /die HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert b"Content-Length: 100" in head and body == b"hello"  # truncated: visible
    out = await exchange(port, b"GET /garbage HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 502")


async def test_stale_pooled_connection_is_retried(
    proxy: tuple[GatekeeperProxy, int], raw_backend: RawBackend
) -> None:
    _, port = proxy
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(3):  # each upstream connection is closed by the upstream after use
        writer.write(b"GET /once HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert await reader.readexactly(4) == b"once"
        await asyncio.sleep(0.1)
    writer.close()
    assert raw_backend.connections == 3


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
            b"400",
        ),  # a chunk size that is not hex
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcdefgh\r\n",
            b"400",
        ),  # a chunk longer than its size
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n\r\n",
            b"400",
        ),  # both framings: request smuggling
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            b"400",
        ),
        (
            b"GET / HTTP/1.1\r\n" + (b"X-A: " + b"a" * 38 + b"\r\n") * 2000 + b"\r\n",
            b"431",
        ),  # a head over 64 KiB in short lines
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", b"431"),
        (b"G\x00T / HTTP/1.1\r\n\r\n", b"400"),
        (b"GET /\x7f HTTP/1.1\r\n\r\n", b"400"),
        (b"GET / HTTP/9.9\r\n\r\n", b"400"),
        (b"\r\n\r\n\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", b"400"),  # TLS hello
    ],
)
async def test_hostile_bytes_are_refused_counted_and_kept_from_the_upstream(
    proxy: tuple[GatekeeperProxy, int], raw_backend: RawBackend, payload: bytes, status: bytes
) -> None:
    p, port = proxy
    out = b""
    with contextlib.suppress(ConnectionResetError):
        out = await exchange(port, payload)
    assert out.startswith(b"HTTP/1.1 " + status), out[:80]
    assert b"Connection: close" in out
    assert p.stats()["bad_requests"] == 1
    assert all(b"POST" not in h and b"X-A" not in h for h in raw_backend.heads)
    # and the proxy keeps serving
    ok = await exchange(port, b"GET /fine HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200") and ok.endswith(b"GET /fine 0")


async def test_slowloris_head_is_cut_at_the_header_timeout(raw_backend: RawBackend) -> None:
    port, acc, ctl = free_ports(3)
    gk = AsyncGatekeeper(f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}", ["api"])
    p = GatekeeperProxy(
        f"http://127.0.0.1:{raw_backend.port}", HttpGate("api"), gk, header_timeout_s=0.5
    )
    await p.start("127.0.0.1", port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
        for _ in range(4):  # a byte every 0.1 s
            await asyncio.sleep(0.1)
            writer.write(b"X")
        assert await asyncio.wait_for(reader.read(), 3) == b""
        writer.close()
        assert p.stats()["header_timeouts"] == 1
        assert raw_backend.heads == []
        # a kept-alive client between requests is not cut while its request runs
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"GET /a 0"), 5)).startswith(b"HTTP/1.1")
        writer.close()
    finally:
        await p.close()


async def test_stop_lets_requests_in_progress_finish(
    proxy: tuple[GatekeeperProxy, int],
) -> None:
    p, port = proxy
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /sleep HTTP/1.1\r\nHost: x\r\n\r\n")
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(0.2)  # the request is with the upstream
    closing = asyncio.get_running_loop().create_task(p.close())
    await asyncio.sleep(0.1)
    assert await asyncio.wait_for(idle_reader.read(), 2) == b""  # idle: closed at once
    with pytest.raises(OSError):  # no longer listening
        await asyncio.open_connection("127.0.0.1", port)
    response = await asyncio.wait_for(reader.read(), 5)  # answered whole, then closed
    assert response.startswith(b"HTTP/1.1 200") and response.endswith(b"slept")
    assert b"Connection: close" in response
    await asyncio.wait_for(closing, 5)
    writer.close()
    idle_writer.close()


async def test_silent_upstream_is_502_after_the_upstream_timeout(raw_backend: RawBackend) -> None:
    port, acc, ctl = free_ports(3)
    gk = AsyncGatekeeper(f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}", ["api"])
    p = GatekeeperProxy(
        f"http://127.0.0.1:{raw_backend.port}", HttpGate("api"), gk, upstream_timeout_s=0.5
    )
    await p.start("127.0.0.1", port)
    try:
        out = await exchange(port, b"GET /silent HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 502")
        ok = await exchange(port, b"GET /fine HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")
    finally:
        await p.close()


def _mutations(rng: random.Random) -> list[bytes]:
    """Valid requests with a byte flipped, cut short, or repeated; and random bytes."""
    valid = [
        b"GET /a?b=c HTTP/1.1\r\nHost: x\r\nX-Client: c\r\n\r\n",
        b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HEAD / HTTP/1.0\r\n\r\n",
    ]
    out = []
    for _ in range(120):
        data = bytearray(rng.choice(valid))
        roll = rng.random()
        if roll < 0.5:
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif roll < 0.7:
            data = data[: rng.randrange(1, len(data))]
        elif roll < 0.85:
            data = data * rng.randrange(2, 5)
        else:
            data = bytearray(rng.randbytes(rng.randrange(1, 200)))
        out.append(bytes(data))
    return out


async def test_fuzzed_requests_never_break_the_proxy(
    proxy: tuple[GatekeeperProxy, int], caplog: pytest.LogCaptureFixture
) -> None:
    p, port = proxy
    rng = random.Random(20261127)
    for payload in _mutations(rng):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        with contextlib.suppress(ConnectionError):
            writer.write_eof()
            # every connection ends: answered, refused, or cut at the end of its input
            await asyncio.wait_for(reader.read(-1), 5)
        writer.close()
    # no error of the proxy's, and nothing malformed passed on to the upstream's parser
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    ok = await exchange(port, b"GET /fine HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200")
    assert p.stats()["bad_requests"] > 0
