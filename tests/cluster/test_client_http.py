"""The clients' HTTP/1.1 transports (smockron.cluster.client._http, _httpcodec), sync and asyncio.

Against real ``smockron cluster`` node processes: the same answers as gRPC, one kept-alive
connection for many checks (counted on the server's side, in the kernel's socket table),
a reconnect after the node restarts, TLS. Against ``FakeGateway``, a real socket server
on loopback that answers scripted bytes: timeouts, the gateway's error bodies, and
hostile responses, each a clean ClientError in bounded time, never a hang.

Tests taking ``kind`` run once with the sync Client and once with an AsyncClient driven
from the test through ``LoopClient`` (its loop runs only during a call, as for a caller
that does not await between checks); test_client_http_async.py has the asyncio-only ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
import pytest

from smockron.cluster import tlsgen
from smockron.cluster.client import (
    MINUTE,
    SECOND,
    Algorithm,
    AsyncClient,
    Behavior,
    Client,
    ClientError,
    ClientTimeout,
    ClientUnavailable,
    ItemError,
)
from smockron.cluster.client._httpcodec import MAX_HEAD, MAX_RESPONSE_BODY, encode_requests
from smockron.cluster.model import RateLimitRequest, RateLimitResponse, Status
from tests.support import Proc, free_ports, run_smockron, wait_for, wait_port


@dataclass
class NodeProc:
    grpc_address: str
    http_address: str
    http_port: int
    proc: Proc


def start_node(tmp: Path, ports: list[int], *extra: str) -> NodeProc:
    grpc_port, http_port = ports
    grpc_address = f"127.0.0.1:{grpc_port}"
    args = [
        "cluster",
        "--grpc-address",
        grpc_address,
        "--http-address",
        f"127.0.0.1:{http_port}",
        *extra,
    ]
    proc = run_smockron(args, tmp / f"node-{grpc_port}.log")
    try:
        wait_port(grpc_port, timeout=20)
        wait_port(http_port, timeout=20)
    except BaseException:
        proc.stop()
        raise
    return NodeProc(grpc_address, f"127.0.0.1:{http_port}", http_port, proc)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    running = start_node(tmp_path_factory.mktemp("client-http"), free_ports(2))
    yield running
    running.proc.stop()


def established(port: int) -> int:
    """TCP connections to 127.0.0.1:``port`` in the kernel's table, as the server sees
    them (state ESTABLISHED, local port ``port``)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "01":
            count += 1
    return count


class LoopClient:
    """An AsyncClient called from sync test code: every call runs to its end on one
    private event loop, which does not run between calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.client = self.loop.run_until_complete(self._make(args, kwargs))
        except BaseException:
            self.loop.close()
            raise
        self.http = self.client.http

    @staticmethod
    async def _make(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncClient:
        return AsyncClient(*args, **kwargs)

    def check(self, *args: Any, **kwargs: Any) -> RateLimitResponse:
        return self.loop.run_until_complete(self.client.check(*args, **kwargs))

    def get_rate_limits(self, requests: list[RateLimitRequest]) -> list[RateLimitResponse]:
        return self.loop.run_until_complete(self.client.get_rate_limits(requests))

    def __enter__(self) -> LoopClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


Kind = Literal["sync", "async"]
both = pytest.mark.parametrize("kind", ["sync", "async"])
"""Run a test with the sync Client and with the AsyncClient."""


def make_client(kind: Kind, *args: Any, **kwargs: Any) -> Client | LoopClient:
    return Client(*args, **kwargs) if kind == "sync" else LoopClient(*args, **kwargs)


def same(resp: RateLimitResponse) -> tuple[object, ...]:
    return (resp.status, resp.limit, resp.remaining, resp.reset_time, resp.error, resp.metadata)


@both
def test_http_gives_the_answers_grpc_gives(node: NodeProc, kind: Kind) -> None:
    """Checks alternate between the transports on the same keys: one count, and each
    answer field for field what the other transport says."""
    with (
        Client(node.grpc_address, timeout=5, transport="grpc") as by_grpc,
        make_client(kind, node.grpc_address, timeout=5, http_address=node.http_address) as by_http,
    ):
        assert by_grpc.http is None and by_http.http is not None
        cases: list[tuple[str, str, dict[str, Any]]] = [
            ("h_tb", "a", {}),
            ("h_lb", "a", {"algorithm": Algorithm.LEAKY_BUCKET}),
            ("h_burst", "a", {"algorithm": Algorithm.LEAKY_BUCKET, "burst": 5}),
            ('h_uni\u00e9"\\', "k\u2603\n", {"behavior": Behavior.NO_BATCHING}),
            ("h_md", "a", {"metadata": {"who": "me", 'q"': "\u00e9"}}),
        ]
        for name, key, case in cases:
            name += kind
            got = []
            for i in range(8):
                client = by_http if i % 2 else by_grpc
                got.append(client.check(name, key, 1, 5, MINUTE, **case))
            assert [r.remaining for r in got][:5] == [4, 3, 2, 1, 0], name
            assert [r.status for r in got] == [Status.UNDER_LIMIT] * 5 + [Status.OVER_LIMIT] * 3
            # a look (hits=0) by each transport: the very same answer
            looks = [c.check(name, key, 0, 5, MINUTE, **case) for c in (by_http, by_grpc)]
            assert same(looks[0]) == same(looks[1])
        # an item the server rejects: the same ItemError text either way
        errors = []
        for client in (by_http, by_grpc):
            with pytest.raises(ItemError) as info:
                client.check("h_bad", "k", 1, -1, MINUTE)
            errors.append(info.value.response.error)
        assert errors[0] == errors[1] and errors[0]
        # a check with its own timeout goes alone: over HTTP too
        assert by_http.check("h_to" + kind, "k", 1, 5, MINUTE, timeout=2).remaining == 4


@both
def test_batches_over_http_match_grpc(node: NodeProc, kind: Kind) -> None:
    name = "h_many" + kind
    many = [RateLimitRequest(name, f"k{i}", 1, 10, MINUTE) for i in range(1500)]
    many[3] = RateLimitRequest(name, "bad", 1, -1, MINUTE)
    with (
        make_client(kind, node.grpc_address, http_address=node.http_address, transport="http") as h,
        Client(node.grpc_address, transport="grpc") as g,
    ):
        first = h.get_rate_limits(many)  # 1,000 + 500, both over HTTP
        second = g.get_rate_limits(many)
        # the async client sends the two parts at once, on two connections
        assert h.http is not None and h.http.connections == (1 if kind == "sync" else 2)
    assert [r.remaining for r in first] == [0 if i == 3 else 9 for i in range(1500)]
    assert [r.remaining for r in second] == [0 if i == 3 else 8 for i in range(1500)]
    assert first[3].error and first[3].error == second[3].error


@both
def test_one_kept_alive_connection_for_many_checks(node: NodeProc, kind: Kind) -> None:
    before = established(node.http_port)
    with make_client(kind, node.grpc_address, http_address=node.http_address) as client:
        for i in range(200):
            assert client.check("h_keep" + kind, "k", 1, 1000, MINUTE).remaining == 999 - i
        assert client.http is not None and client.http.connections == 1
        # the server's side: one connection more than before, and only while open
        assert established(node.http_port) == before + 1
    wait_for(lambda: established(node.http_port) == before, timeout=5)


def test_threads_share_the_client(node: NodeProc) -> None:
    """Threads of one Client: lone checks over HTTP, coalesced ones over gRPC; every
    check counted once."""
    with (
        Client(node.grpc_address, http_address=node.http_address) as client,
        ThreadPoolExecutor(16) as pool,
    ):
        got = list(
            pool.map(lambda i: client.check("h_thr", "k", 1, 1000, MINUTE).remaining, range(400))
        )
        assert client.http is not None and client.http.connections <= 16
    assert sorted(got) == list(range(600, 1000))


@both
def test_reconnects_after_the_node_restarts(tmp_path: Path, kind: Kind) -> None:
    ports = free_ports(2)
    running = start_node(tmp_path, ports)
    try:
        with make_client(
            kind, running.grpc_address, timeout=2, http_address=running.http_address
        ) as c:
            assert c.check("h_restart", "k", 1, 10, MINUTE).remaining == 9
            running.proc.stop()
            with pytest.raises(ClientUnavailable) as down:
                c.check("h_restart", "k", 1, 10, MINUTE)
            # refused at once: at the deadline it would be DEADLINE_EXCEEDED (ClientTimeout)
            assert down.value.code is grpc.StatusCode.UNAVAILABLE
            running = start_node(tmp_path, ports)
            # a new node process: the count starts again, on a new connection
            assert c.check("h_restart", "k", 1, 10, MINUTE).remaining == 9
            assert c.check("h_restart", "k", 1, 10, MINUTE).remaining == 8
            assert c.http is not None and c.http.connections == 2
    finally:
        running.proc.stop()


@both
def test_https_gateway(tmp_path: Path, kind: Kind) -> None:
    ca, ca_key = tlsgen.make_ca()
    cert, key = tlsgen.make_cert(ca, ca_key, ["localhost", "127.0.0.1"])
    for name, data in {"ca.pem": ca, "node.pem": cert, "node.key": key}.items():
        (tmp_path / name).write_bytes(data)
    flags = (
        "--tls-ca",
        str(tmp_path / "ca.pem"),
        "--tls-cert",
        str(tmp_path / "node.pem"),
        "--tls-key",
        str(tmp_path / "node.key"),
    )
    running = start_node(tmp_path, free_ports(2), *flags)
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
        with pytest.raises(ValueError, match="ssl_context"):
            make_client(
                kind, running.grpc_address, credentials=creds, http_address=running.http_address
            )
        context = ssl.create_default_context(cadata=ca.decode())
        with make_client(
            kind,
            running.grpc_address,
            credentials=creds,
            http_address=running.http_address,
            ssl_context=context,
        ) as client:
            got = [client.check("h_tls", "k", 1, 10, MINUTE).remaining for _ in range(20)]
            assert got == list(range(9, -1, -1)) + [0] * 10
            assert client.http is not None and client.http.connections == 1
        # a certificate the client does not trust: unavailable, as gRPC says it
        untrusting = make_client(
            kind,
            running.grpc_address,
            credentials=creds,
            http_address=running.http_address,
            ssl_context=ssl.create_default_context(),
        )
        with untrusting, pytest.raises(ClientUnavailable, match="TLS"):
            untrusting.check("h_tls", "k", 1, 10, MINUTE)
    finally:
        running.proc.stop()


@both
def test_transport_choice(kind: Kind) -> None:
    with make_client(kind, "127.0.0.1:1") as plain:
        assert plain.http is None
    with make_client(kind, "127.0.0.1:1", http_address="127.0.0.1:2") as auto:
        assert auto.http is not None and auto.http.address == "127.0.0.1:2"
    with make_client(
        kind, "127.0.0.1:1", http_address="127.0.0.1:2", transport="grpc"
    ) as grpc_only:
        assert grpc_only.http is None
    with pytest.raises(ValueError, match="http_address"):
        make_client(kind, "127.0.0.1:1", transport="http")
    with pytest.raises(ValueError, match="transport"):
        make_client(kind, "127.0.0.1:1", transport="h2")
    with pytest.raises(ValueError, match="HOST:PORT"):
        make_client(kind, "127.0.0.1:1", http_address="localhost")


# -- scripted gateway ------------------------------------------------------------------------


class FakeGateway:
    """A real HTTP server socket on loopback answering each request with
    ``respond(request bytes)``: bytes to send, or None to send nothing (a server that
    hangs). ``close_after`` closes the connection after each answer. Bounded: every
    socket has a 5 s timeout and everything is closed by ``close``."""

    def __init__(self, respond: Callable[[bytes], bytes | None], close_after: bool = False):
        self.respond = respond
        self.close_after = close_after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        self.requests: list[bytes] = []
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._open.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        data = b""
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                while b"\r\n\r\n" not in data:
                    got = conn.recv(65536)
                    if not got:
                        return
                    data += got
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + data[:length])
                data = data[length:]
                answer = self.respond(self.requests[-1])
                if answer is None:
                    self._stop.wait(5)
                    return
                conn.sendall(answer)
                if self.close_after:
                    conn.close()
                    return

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        for conn in self._open:
            with contextlib.suppress(OSError):
                conn.close()
        for thread in self._threads:
            thread.join(6)


@contextlib.contextmanager
def fake(
    respond: Callable[[bytes], bytes | None], close_after: bool = False, kind: Kind = "sync"
) -> Iterator[tuple[FakeGateway, Client | LoopClient]]:
    gateway = FakeGateway(respond, close_after)
    try:
        with make_client(kind, "127.0.0.1:1", timeout=1, http_address=gateway.address) as client:
            yield gateway, client
    finally:
        gateway.close()


def http(status: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


GOOD = json.dumps(
    {
        "responses": [
            {
                "status": "OVER_LIMIT",
                "limit": "5",
                "remaining": "0",
                "reset_time": "1700000000000",
                "error": "",
                "metadata": {"owner": "x"},
            }
        ]
    }
).encode()


@both
def test_request_is_the_gateway_json(kind: Kind) -> None:
    """What goes on the wire: the JSON the gateway parses, numbers for int64 and enums."""
    req = RateLimitRequest(
        'n"',
        "k",
        2,
        5,
        MINUTE,
        Algorithm.LEAKY_BUCKET,
        Behavior.GLOBAL | Behavior.NO_BATCHING,
        3,
        {"a": "b"},
        17,
    )
    assert json.loads(encode_requests([req, req])) == {
        "requests": [
            {
                "name": 'n"',
                "unique_key": "k",
                "hits": 2,
                "limit": 5,
                "duration": MINUTE,
                "algorithm": 1,
                "behavior": 3,
                "burst": 3,
                "metadata": {"a": "b"},
                "created_at": 17,
            }
        ]
        * 2
    }
    with fake(lambda _: http("200 OK", GOOD), kind=kind) as (gateway, client):
        resp = client.check("n", "k", 1, 5, SECOND)
        assert (resp.status, resp.limit, resp.remaining, resp.reset_time) == (
            Status.OVER_LIMIT,
            5,
            0,
            1_700_000_000_000,
        )
        assert resp.metadata == {"owner": "x"}
        head = gateway.requests[0].split(b"\r\n\r\n")[0]
        assert head.startswith(b"POST /v1/GetRateLimits HTTP/1.1\r\n")
        assert f"Host: {gateway.address}".encode() in head


@both
def test_chunked_and_sparse_answers(kind: Kind) -> None:
    """Go's net/http chunks a long answer, and grpc-gateway may leave zero fields out."""
    sparse = b'{"responses":[{"limit":5,"remaining":"4"}]}'
    body = (
        b"".join(
            b"%x\r\n%s\r\n" % (len(sparse[i : i + 7]), sparse[i : i + 7])
            for i in range(0, len(sparse), 7)
        )
        + b"0\r\n\r\n"
    )
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    with fake(lambda _: answer, kind=kind) as (gateway, client):
        for _ in range(3):
            resp = client.check("n", "k", 1, 5, SECOND)
            assert (resp.status, resp.limit, resp.remaining, resp.reset_time) == (
                Status.UNDER_LIMIT,
                5,
                4,
                0,
            )
        assert gateway.accepted == 1  # kept alive across chunked answers


@both
def test_connection_close_is_honoured(kind: Kind) -> None:
    answer = http("200 OK", GOOD, "Connection: close")
    with fake(lambda _: answer, close_after=True, kind=kind) as (gateway, client):
        for _ in range(3):
            assert client.check("n", "k", 1, 5, SECOND).status is Status.OVER_LIMIT
        assert gateway.accepted == 3


@both
def test_timeout(kind: Kind) -> None:
    with fake(lambda _: None, kind=kind) as (_, client):
        start = time.monotonic()
        with pytest.raises(ClientTimeout) as info:
            client.check("n", "k", 1, 5, SECOND)
        assert time.monotonic() - start > 0.9  # the Client's timeout=1
        assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        start = time.monotonic()
        with pytest.raises(ClientTimeout):
            client.check("n", "k", 1, 5, SECOND, timeout=1.6)
        assert time.monotonic() - start > 1.5  # the call's own timeout, not the Client's


@both
def test_slow_drip_is_held_to_the_deadline(kind: Kind) -> None:
    """A server sending a byte at a time cannot stretch a call past its deadline."""

    def drip(_: bytes) -> bytes:
        time.sleep(0.3)
        return b"HTTP/1.1 200 OK\r\n"  # and then nothing more

    with fake(drip, kind=kind) as (_, client):
        start = time.monotonic()
        with pytest.raises(ClientTimeout):  # never answered: without a deadline, a hang
            client.check("n", "k", 1, 5, SECOND, timeout=0.6)
        assert time.monotonic() - start > 0.5


@pytest.mark.parametrize(
    ("answer", "error", "code"),
    [
        # grpc-gateway's error body keeps the server's code and message
        (
            http("400 Bad Request", b'{"code": 11, "message": "list too large", "details": []}'),
            ClientError,
            grpc.StatusCode.OUT_OF_RANGE,
        ),
        (
            http("500 Internal Server Error", b'{"code": 8, "message": "slow down"}'),
            ClientError,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        (
            http("503 Service Unavailable", b'{"code": 14, "message": "draining"}'),
            ClientUnavailable,
            grpc.StatusCode.UNAVAILABLE,
        ),
        (
            http("504 Gateway Timeout", b'{"code": 4, "message": "too slow"}'),
            ClientTimeout,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        ),
        # other bodies: the HTTP status as gRPC maps it
        (http("404 Not Found", b"404: Not Found"), ClientError, grpc.StatusCode.UNIMPLEMENTED),
        (http("502 Bad Gateway", b"<html>"), ClientUnavailable, grpc.StatusCode.UNAVAILABLE),
        (http("418 Teapot", b'{"code": 99, "message": 1}'), ClientError, grpc.StatusCode.UNKNOWN),
    ],
    ids=["out_of_range", "resource_exhausted", "unavailable", "deadline", "404", "502", "odd"],
)
@both
def test_gateway_errors_map_to_client_errors(
    answer: bytes, error: type[ClientError], code: grpc.StatusCode, kind: Kind
) -> None:
    with fake(lambda _: answer, kind=kind) as (gateway, client):
        with pytest.raises(error) as info:
            client.check("n", "k", 1, 5, SECOND)
        assert type(info.value) is error
        assert info.value.code is code
        assert "GetRateLimits on 127.0.0.1:" in str(info.value)
        if code is grpc.StatusCode.OUT_OF_RANGE:
            assert info.value.details == "list too large"
        with pytest.raises(error):  # the connection stays usable after an error answer
            client.check("n", "k", 1, 5, SECOND)
        assert gateway.accepted == 1


def chunked(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body


HOSTILE = {
    "not_http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "http_2_preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "status_not_digits": b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    "header_without_colon": b"HTTP/1.1 200 OK\r\nbroken header\r\nContent-Length: 2\r\n\r\n{}",
    "header_name_with_space": b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\n{}",
    "blank_run": b"HTTP/1.1 200 OK\r\nContent-Length: 1" + b" " * 60_000 + b"x\r\n\r\n",
    "status_without_space": b"HTTP/1.1 200OK\r\nContent-Length: 0\r\n\r\n",
    "endless_head": b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * (MAX_HEAD + 10),
    "long_head": b"HTTP/1.1 200 OK\r\nX-A: "
    + b"a" * (MAX_HEAD + 10)
    + b"\r\nContent-Length: 2\r\n\r\n{}",
    "huge_content_length": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
    % (MAX_RESPONSE_BODY + 1),
    "negative_length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
    "two_lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "no_framing": b"HTTP/1.1 200 OK\r\n\r\n{}",
    "both_framings": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n{}",
    "gzip_encoding": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
    "bad_chunk_size": chunked(b"zz\r\n{}\r\n0\r\n\r\n"),
    "huge_chunk": chunked(b"7fffffff\r\n{}"),
    "endless_chunk_line": chunked(b"1" * 5000),
    "chunk_without_crlf": chunked(b"2\r\n{}XX0\r\n\r\n"),
    "trailers": chunked(b"2\r\n{}\r\n0\r\nX-T: 1\r\n\r\n"),
    "not_json": http("200 OK", b"<html>hello</html>"),
    "not_utf8": http("200 OK", b"\xff\xfe{}"),
    "deep_json": http("200 OK", b"[" * 100_000),
    "json_list": http("200 OK", b"[1, 2]"),
    "no_responses": http("200 OK", b'{"answers": []}'),
    "two_responses": http("200 OK", b'{"responses": [{}, {}]}'),
    "response_not_object": http("200 OK", b'{"responses": [3]}'),
    "bad_status": http("200 OK", b'{"responses": [{"status": "MAYBE"}]}'),
    "float_limit": http("200 OK", b'{"responses": [{"limit": 1.5}]}'),
    "exp_limit": http("200 OK", b'{"responses": [{"limit": "1e400"}]}'),
    "huge_int": http("200 OK", b'{"responses": [{"limit": %s}]}' % (b"9" * 5000)),
    "bool_remaining": http("200 OK", b'{"responses": [{"remaining": true}]}'),
    "error_not_string": http("200 OK", b'{"responses": [{"error": {"x": 1}}]}'),
    "metadata_not_strings": http("200 OK", b'{"responses": [{"metadata": {"a": 1}}]}'),
    "metadata_list": http("200 OK", b'{"responses": [{"metadata": ["a"]}]}'),
}


BODY_ONLY = {
    "not_json",
    "not_utf8",
    "deep_json",
    "json_list",
    "no_responses",
    "two_responses",
    "response_not_object",
    "bad_status",
    "float_limit",
    "exp_limit",
    "huge_int",
    "bool_remaining",
    "error_not_string",
    "metadata_not_strings",
    "metadata_list",
}


@both
@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_answers_are_clean_errors(name: str, kind: Kind) -> None:
    """Each is a ClientError with code INTERNAL, not a wait for the deadline (that would
    be DEADLINE_EXCEEDED). After broken
    framing the connection is dropped (the next call opens another rather than read the
    rest); after a well-framed body with bad JSON it is kept."""
    with fake(lambda _: HOSTILE[name], kind=kind) as (gateway, client):
        for _ in range(2):
            with pytest.raises(ClientError) as info:
                client.check("n", "k", 1, 5, SECOND, timeout=3)
            assert info.value.code is grpc.StatusCode.INTERNAL, info.value
            assert "malformed response" in str(info.value)
            assert len(str(info.value)) < 1000  # the hostile bytes are clipped
        assert gateway.accepted == (1 if name in BODY_ONLY else 2)
