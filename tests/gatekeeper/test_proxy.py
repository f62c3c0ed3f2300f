"""`smockron proxy` as a real subprocess between httpx and a real backend."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from smockron.wire.codec import ACCEPTED, REJECTED
from tests.gatekeeper.backend import Seen, backend
from tests.gatekeeper.commands import proxy_args
from tests.gatekeeper.conftest import MasterSockets, delayed_by_master, wall_ms
from tests.support import Proc, free_port, smockron_proc, wait_for, wait_port


@pytest.fixture
def upstream() -> Iterator[tuple[int, Seen]]:
    with backend() as b:
        yield b


@pytest.fixture
def proxied(
    master: MasterSockets, upstream: tuple[int, Seen], tmp_path: Path
) -> Iterator[tuple[httpx.Client, Seen, Proc]]:
    port = free_port()
    args = proxy_args(
        port,
        upstream[0],
        master.accounting_addr,
        master.control_addr,
        "--reject-status",
        "429",
        "--decision-header",
        "--stats-interval",
        "0.3",
    )
    with (
        smockron_proc(args, tmp_path / "proxy.log") as proc,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client,
    ):
        wait_port(port)
        until = wall_ms() + 60_000

        def subscribed() -> bool:
            """Control heard (the probe is rejected) and accounting heard (its message
            arrives): each PUB drops messages until the other side has subscribed."""
            master.publish("api", b"probe", until)
            rejected = client.get("/", headers={"x-client": "probe"}).status_code == 429
            return rejected and bool(master.drain(0.1))

        wait_for(subscribed, 10, 0.1)
        master.drain(0.1)
        yield client, upstream[1], proc


def test_forwards_and_rewrites_headers(proxied: tuple[httpx.Client, Seen, Proc]) -> None:
    client, _, _ = proxied
    r = client.get(
        "/a/b?q=1&r=%20x",
        headers={
            "x-client": "alice",
            "x-forwarded-for": "203.0.113.1",
            "connection": "keep-alive, x-hop",
            "x-hop": "drop me",
            "proxy-authorization": "Basic c2VjcmV0",
            "x-keep": "kept",
        },
    )
    assert r.status_code == 200 and r.headers["x-smockron-decision"] == "accept"
    echo = r.json()
    assert echo["path"] == "/a/b?q=1&r=%20x"
    headers = echo["headers"]
    assert headers["x-forwarded-for"] == "203.0.113.1, 127.0.0.1"
    assert headers["x-keep"] == "kept"
    assert "x-hop" not in headers and "proxy-authorization" not in headers
    missing = client.get("/missing", headers={"x-client": "alice"})
    assert missing.status_code == 404


def test_streams_bodies_both_ways(proxied: tuple[httpx.Client, Seen, Proc]) -> None:
    client, _, _ = proxied
    payload = os.urandom(3 * 1024 * 1024 + 17)

    def gen() -> Iterator[bytes]:
        for i in range(0, len(payload), 100_000):
            yield payload[i : i + 100_000]

    r = client.post("/upload", content=gen(), headers={"x-client": "alice"})
    assert r.json()["length"] == len(payload)
    assert r.json()["sha256"] == hashlib.sha256(payload).hexdigest()
    sized = client.put("/upload", content=payload[:1000], headers={"x-client": "alice"})
    assert sized.json()["length"] == 1000
    with client.stream("GET", "/stream", headers={"x-client": "alice"}) as s:
        assert "x-upstream-hop" not in s.headers
        chunks = list(s.iter_lines())
    assert chunks == [f"chunk{i}" for i in range(5)]


def test_response_is_streamed_not_buffered(proxied: tuple[httpx.Client, Seen, Proc]) -> None:
    client, _, _ = proxied
    t0 = time.monotonic()
    with client.stream("GET", "/slow", headers={"x-client": "alice"}) as s:
        lines = s.iter_lines()
        assert next(lines) == "chunk0"
        first = time.monotonic() - t0
        assert next(lines) == "chunk1"
        last = time.monotonic() - t0
    # the upstream sends its second chunk 0.6 s after the first: a buffering proxy would
    # hand over nothing before it
    assert first < 0.45 and last >= 0.55, (first, last)


def test_request_body_is_streamed_not_buffered(
    proxied: tuple[httpx.Client, Seen, Proc],
) -> None:
    client, seen, _ = proxied

    def slow_body() -> Iterator[bytes]:
        yield b"first"
        time.sleep(0.6)
        yield b"second"

    t0 = time.monotonic()
    r = client.post("/upload", content=slow_body(), headers={"x-client": "alice"})
    assert r.json()["length"] == len(b"firstsecond")
    # the upstream saw the first chunk while the client was still holding the second
    assert seen.first_chunks and seen.first_chunks[-1] - t0 < 0.45, seen.first_chunks


def test_keeps_upstream_connections_alive(proxied: tuple[httpx.Client, Seen, Proc]) -> None:
    client, seen, _ = proxied
    before = len(seen.connections)
    for _ in range(30):
        assert client.get("/", headers={"x-client": "alice"}).status_code == 200
    assert len(seen.connections) - before <= 2


def test_delays_rejects_and_accounts(
    proxied: tuple[httpx.Client, Seen, Proc], master: MasterSockets
) -> None:
    client, _, proc = proxied
    client.get("/", headers={"x-client": "alice", "user-agent": "ua-test"})
    msg = master.recv()
    assert msg.status == ACCEPTED and msg.identifier == b"alice"
    assert msg.loginfo is not None and b"ua-test" in msg.loginfo
    delayed_by_master(client, master)
    master.publish("api", b"eve", wall_ms() + 1800)
    time.sleep(0.1)
    r = client.get("/", headers={"x-client": "eve", "accept": "application/problem+json"})
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    assert r.json()["status"] == 429
    assert REJECTED in [m.status for m in master.drain(0.2)]
    # garbage on the control socket: logged, ignored, the proxy keeps serving
    for _ in range(50):
        master.publish_raw([b"api\0", b"DELAY_UNTIL", b"x", b"not-a-number"])
    master.publish_raw([b"api\0"])
    assert client.get("/", headers={"x-client": "alice"}).status_code == 200
    wait_for(lambda: "malformed control message" in proc.log(), 5)
    assert proc.log().count("malformed control message") == 1
    wait_for(lambda: "control_malformed=51" in proc.log(), 5)  # counted in the stats line


def test_garbage_http_is_answered_counted_and_not_logged_in_floods(
    proxied: tuple[httpx.Client, Seen, Proc],
) -> None:
    client, seen, proc = proxied
    port = client.base_url.port
    assert port is not None
    garbage = [
        b"GARBAGE\x00\xff\r\n\r\n",  # not HTTP at all: a bad method
        os.urandom(4000),
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n",  # header line too long
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ]
    before = len(seen.arrivals)
    for _ in range(4):
        for payload in garbage:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(payload)
                with contextlib.suppress(ConnectionResetError):
                    s.recv(100)
    assert len(seen.arrivals) == before  # nothing malformed reached the backend
    # still serving, and the garbage is a counter plus one rate-limited line, no tracebacks
    assert client.get("/", headers={"x-client": "alice"}).status_code == 200
    wait_for(lambda: re.search(r"bad_requests=(1[6-9]|20)\b", proc.log()) is not None, 5)
    assert proc.log().count("malformed HTTP request") == 1
    assert "Traceback" not in proc.log()


def test_upstream_down_is_502(master: MasterSockets, tmp_path: Path) -> None:
    port, dead = free_port(), free_port()
    args = proxy_args(port, dead, master.accounting_addr, master.control_addr)
    with (
        smockron_proc(args, tmp_path / "p.log"),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client,
    ):
        wait_port(port)
        assert client.get("/", headers={"x-client": "a"}).status_code == 502


def test_bad_flags_fail_cleanly(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from smockron.cli import main

    base = ["proxy", "--listen", "127.0.0.1:1", "--upstream", "http://x", "--domain", "api"]
    for extra in (["--identify", "cookie"], ["--max-delay", "soon"], ["--trusted-proxy", "x/99"]):
        result = CliRunner().invoke(main, base + extra)
        assert result.exit_code == 2, result.output
    result = CliRunner().invoke(
        main, ["proxy", "--listen", "nope", "--upstream", "ftp://x", "--domain", "a"]
    )
    assert result.exit_code == 2


@pytest.mark.parametrize(
    ("text", "ms"), [("2s", 2000), ("500ms", 500), ("1.5s", 1500), ("1m", 60_000), ("5", 5000)]
)
def test_parse_duration(text: str, ms: int) -> None:
    from smockron.gatekeeper.cli import parse_duration_ms

    assert parse_duration_ms(text) == ms


def test_trusted_proxy_identification(
    master: MasterSockets, upstream: tuple[int, Seen], tmp_path: Path
) -> None:
    port = free_port()
    args = proxy_args(port, upstream[0], master.accounting_addr, master.control_addr)
    args[args.index("header:X-Client")] = "ip"
    args += ["--trusted-proxy", "127.0.0.0/8"]
    with (
        smockron_proc(args, tmp_path / "proxy.log"),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client,
    ):
        wait_port(port)

        def accounted() -> bool:
            client.get("/", headers={"x-forwarded-for": "6.6.6.6, 198.51.100.7"})
            return any(m.identifier == b"198.51.100.7" for m in master.drain(0.05))

        wait_for(accounted, 10, 0.05)
        client.get("/", headers={"x-forwarded-for": "6.6.6.6, 198.51.100.7"})
        ids = {m.identifier for m in master.drain(0.3)}
        assert ids == {b"198.51.100.7"}  # the forged left-most hop is ignored
