"""The clients' HTTP/1.1 transport: ``POST /v1/GetRateLimits`` on the JSON gateway
(smockron.cluster.transports.http, or Gubernator's grpc-gateway) over kept-alive connections.

Why: a lone check over HTTP/1.1 on an open socket costs the client less CPU than a gRPC
unary call, even through libgrpc++ (no HTTP/2 framing, no completion queue, no other
thread), and a sequential caller pays that per check. The socket is read and parsed
here rather than by a library: httpx, urllib3 and the stdlib's http.client each cost a
caller several times as much CPU per lone check, and more per batch too, measured as
the Client calls (bench/httpclient.py; figures in docs/benchmarks.md).
Batches stay cheaper on gRPC (protobuf beats JSON per item), so the Client sends only
lone checks here unless told otherwise.

Two parts: pure codecs (``encode_requests``, ``decode_responses``, ``parse_head``,
``parse_whole``, ``ResponseParser``) that know the gateway's JSON and HTTP/1.1 framing,
and the pools of connections that only move bytes: ``HttpTransport`` (blocking sockets,
the sync Client's) and ``AsyncHttpTransport`` (asyncio Protocols, the AsyncClient's).
The response parser treats the bytes as hostile: head and body sizes are bounded, framing
is Content-Length or chunked only, every field is type-checked, and anything else is a
``CallError`` with code INTERNAL, never a hang (every read has the call's deadline).

Failures are ``CallError(code, details)`` with gRPC status code numbers, as the native
channel raises, so the Client maps both to the same ClientError types: refused or broken
connections are UNAVAILABLE, a passed deadline DEADLINE_EXCEEDED, and a gateway error
body ``{"code": n, "message": ...}`` keeps the server's own code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import select
import socket
import ssl
import struct
import time
from collections.abc import Generator, Sequence
from functools import partial
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, Generic, NoReturn, TypeVar, cast

from smockron.cluster.model import RateLimitRequest, RateLimitResponse, Status
from smockron.errors import ConfigError
from smockron.settings import parse_host_port

MAX_HEAD = 64 * 1024
"""Bytes of status line and headers accepted in one response."""
MAX_RESPONSE_BODY = 32 * 1024 * 1024
"""Bytes of body accepted (1,000 answers with some metadata fit many times over)."""
_RECV = 64 * 1024

# gRPC status codes (grpc.StatusCode values), as numbers so the codecs import no grpc
UNKNOWN, DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE = 2, 4, 13, 14
# HTTP statuses without a gateway error body, as gRPC's "HTTP to gRPC status" table
_HTTP_CODES = {400: INTERNAL, 401: 16, 403: 7, 404: 12, 429: UNAVAILABLE, 502: UNAVAILABLE,
               503: UNAVAILABLE, 504: UNAVAILABLE}  # fmt: skip

_dumps_str: Any = encode_basestring_ascii
_UNDER, _OVER = Status.UNDER_LIMIT, Status.OVER_LIMIT
_STATUSES = {"UNDER_LIMIT": _UNDER, "OVER_LIMIT": _OVER, 0: _UNDER, 1: _OVER}


class CallError(Exception):
    """A failed call: ``args`` are (gRPC status code number, details)."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(code, details)


def _bad(details: str) -> CallError:
    return CallError(INTERNAL, f"malformed response from the HTTP gateway: {details}")


# -- request ------------------------------------------------------------------------------


def encode_requests(requests: Sequence[RateLimitRequest]) -> bytes:
    """The GetRateLimitsReq JSON the gateway parses: int64 as numbers, enums by number
    (both forms protobuf's JSON mapping accepts), strings escaped to ASCII."""
    items = []
    for r in requests:
        # ":d" refuses a float, as the protobuf message would
        item = (
            f'{{"name":{_dumps_str(r.name)},"unique_key":{_dumps_str(r.unique_key)},'
            f'"hits":{r.hits:d},"limit":{r.limit:d},"duration":{r.duration:d},'
            f'"algorithm":{r.algorithm:d},"behavior":{r.behavior:d},"burst":{r.burst:d}'
        )
        if r.metadata:
            item += ',"metadata":' + json.dumps(r.metadata)
        if r.created_at is not None:
            item += f',"created_at":{r.created_at:d}'
        items.append(item)
    return ('{"requests":[' + "},".join(items) + "}]}").encode()


# -- response -----------------------------------------------------------------------------


def decode_responses(body: bytes, count: int) -> list[RateLimitResponse]:
    """The ``count`` answers of a GetRateLimitsResp JSON body, in order. Absent fields
    are zero (grpc-gateway may omit them); int64 may be a number or a decimal string."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _bad(f"body is not JSON: {str(exc)[:200]}") from None
    items = data.get("responses") if type(data) is dict else None
    if type(items) is not list:
        raise _bad("no 'responses' list")
    if len(items) != count:
        raise _bad(f"{len(items)} responses for {count} requests")
    out = []
    for item in items:
        if type(item) is not dict:
            raise _bad("a response is not an object")
        get = item.get
        status = _STATUSES.get(get("status", 0))
        error = get("error", "")
        metadata = get("metadata")
        if status is None or type(error) is not str:
            raise _bad(f"bad status or error in {_clip(item)}")
        if metadata:
            if type(metadata) is not dict or not all(type(v) is str for v in metadata.values()):
                raise _bad(f"metadata is not an object of strings in {_clip(item)}")
        else:
            metadata = {}
        out.append(
            RateLimitResponse(
                status,
                _int(get("limit", 0), item),
                _int(get("remaining", 0), item),
                _int(get("reset_time", 0), item),
                error,
                metadata,
            )
        )
    return out


def _int(value: object, item: dict[str, Any]) -> int:
    """An int64 field: a JSON integer, or a decimal string (protobuf's JSON form)."""
    if type(value) is int:
        return value
    if type(value) is str and 0 < len(value) <= 20 and value.lstrip("-").isdigit():
        return int(value)
    raise _bad(f"not an integer: {_clip(value)} in {_clip(item)}")


def _clip(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def gateway_error(status: int, body: bytes) -> CallError:
    """The failure a non-200 answer means: grpc-gateway's ``{"code", "message"}`` body
    keeps the server's code; otherwise the HTTP status maps as gRPC maps it."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    if type(data) is dict:
        code, message = data.get("code"), data.get("message")
        if type(code) is int and 0 < code <= 16 and type(message) is str:
            return CallError(code, message)
    text = body[:200].decode("utf-8", "replace")
    return CallError(_HTTP_CODES.get(status, UNKNOWN), f"HTTP {status}: {text!r}")


_HEADER_LINES = re.compile(rb"(?:\r\n[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n]*)*")
"""Every line after the status line: a token name, a colon, no CR or LF in the value."""
_FRAMING = re.compile(
    rb"\r\n(content-length|transfer-encoding|connection):([^\r\n]*)", re.IGNORECASE
)
"""The headers that frame the answer. Greedy to the end of the line, stripped after:
a lazy match with trailing blanks would backtrack quadratically on a long run of them."""
_HEX = re.compile(rb"[0-9A-Fa-f]{1,8}")


def parse_head(head: bytes) -> tuple[int, int | None, bool]:
    """(status, Content-Length or None for chunked, keep-alive) of a response head (the
    bytes before the blank line). Anything but HTTP/1.x with one framing is refused."""
    version, code = head[:9], head[9:12]
    eol = head.find(b"\r\n")
    if eol < 0:
        eol = len(head)
    if (
        version not in (b"HTTP/1.1 ", b"HTTP/1.0 ")
        or not code.isdigit()
        or (eol > 12 and head[12] != 32)  # a space before the reason phrase
    ):
        raise _bad(f"status line {head[: min(eol, 100)]!r}")
    if not _HEADER_LINES.fullmatch(head, eol):
        raise _bad(f"header lines {head[eol : eol + 200]!r}")
    keep = version == b"HTTP/1.1 "
    length: int | None = None
    chunked = False
    for name, raw in _FRAMING.findall(head, eol):
        name, value = name.lower(), raw.strip(b" \t")
        if name == b"content-length":
            if not value.isdigit() or len(value) > 12 or (length is not None and
                                                           int(value) != length):  # fmt: skip
                raise _bad(f"Content-Length {value[:100]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            if value.lower() != b"chunked":
                raise _bad(f"Transfer-Encoding {value[:100]!r}")
            chunked = True
        else:
            tokens = {t.strip() for t in value.lower().split(b",")}
            keep = b"close" not in tokens and (keep or b"keep-alive" in tokens)
    if chunked == (length is not None):
        raise _bad("neither or both of Content-Length and chunked")
    if length is not None and length > MAX_RESPONSE_BODY:
        raise _bad(f"body of {length} bytes (at most {MAX_RESPONSE_BODY})")
    return int(code), length, keep


# -- transport ----------------------------------------------------------------------------


def parse_whole(data: bytes) -> tuple[int, bytes, bool] | None:
    """(status, body, keep-alive) when ``data``, one read, is exactly one answer framed by
    Content-Length (the common case, at the cost of one head parse); None otherwise:
    then a ``ResponseParser`` takes it from the start."""
    end = data.find(b"\r\n\r\n")
    if end >= 0:
        if end > MAX_HEAD:  # one read of the event loop's can hold more than MAX_HEAD
            raise _bad(f"head longer than {MAX_HEAD} bytes")
        status, length, keep = parse_head(data[:end])
        if length is not None and len(data) == end + 4 + length:
            return status, data[end + 4 :], keep
    return None


class ResponseParser:
    """One response, fed as it arrives (sans I/O: the sync and the asyncio transports
    both read through it). ``feed`` returns (status, body, keep-alive) once the answer is
    complete, None while it needs more; CallError INTERNAL for what is not a well-formed,
    bounded answer. Keep-alive is false when bytes follow the answer: out of step."""

    __slots__ = ("_buf", "_steps")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._steps = self._parse()

    def feed(self, data: bytes) -> tuple[int, bytes, bool] | None:
        self._buf += data
        try:
            next(self._steps)
        except StopIteration as done:
            result: tuple[int, bytes, bool] = done.value
            return result
        return None

    def _parse(self) -> Generator[None, None, tuple[int, bytes, bool]]:
        """Yields whenever it needs more of ``_buf``. Offsets, not slices: linear in the
        answer's size."""
        buf = self._buf
        scanned = 0
        while (end := buf.find(b"\r\n\r\n", scanned)) < 0:
            if len(buf) > MAX_HEAD:
                raise _bad(f"head longer than {MAX_HEAD} bytes")
            scanned = max(len(buf) - 3, 0)
            yield
        if end > MAX_HEAD:
            raise _bad(f"head longer than {MAX_HEAD} bytes")
        status, length, keep = parse_head(bytes(buf[:end]))
        pos = end + 4
        if length is None:
            body, pos = yield from self._chunked(pos)
        else:
            while len(buf) - pos < length:
                yield
            body = bytes(buf[pos : pos + length])
            pos += length
        return status, body, keep and pos == len(buf)

    def _chunked(self, pos: int) -> Generator[None, None, tuple[bytes, int]]:
        """(body, offset past it) of a chunked body starting at ``_buf[pos]``."""
        buf = self._buf
        parts: list[bytes] = []
        size = 0
        while True:
            scanned = pos
            while (eol := buf.find(b"\r\n", scanned)) < 0:
                if len(buf) - pos > 1024:
                    raise _bad("chunk size line too long")
                scanned = max(len(buf) - 1, pos)
                yield
            line = bytes(buf[pos:eol]).partition(b";")[0].strip(b" \t")
            if not _HEX.fullmatch(line):
                raise _bad(f"chunk size {line[:100]!r}")
            chunk = int(line, 16)
            size += chunk
            if size > MAX_RESPONSE_BODY:
                raise _bad(f"chunked body over {MAX_RESPONSE_BODY} bytes")
            pos = eol + 2
            if chunk == 0:  # no trailers expected: just the final CRLF
                while len(buf) - pos < 2:
                    yield
                if buf[pos : pos + 2] != b"\r\n":
                    raise _bad("trailers after a chunked body")
                return b"".join(parts), pos + 2
            while len(buf) - pos < chunk + 2:
                yield
            if buf[pos + chunk : pos + chunk + 2] != b"\r\n":
                raise _bad("chunk not followed by CRLF")
            parts.append(bytes(buf[pos : pos + chunk]))
            pos += chunk + 2


class _Connection:
    """One socket, in blocking mode with kernel timeouts (SO_RCVTIMEO, SO_SNDTIMEO): a
    read or write is one system call, without the poll() Python adds before each on a
    socket with a timeout. Kept for the next call only when a response ended exactly at
    the end of what was read (so it never carries bytes over)."""

    __slots__ = ("_poll", "sock", "timeout")

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(None)
        self.sock = sock
        self.timeout = -1.0
        """The kernel timeouts set now, in seconds (-1: none set yet)."""
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def alive(self) -> bool:
        """False when the server closed the idle connection (or sent unasked bytes):
        looked at without waiting, as urllib3 checks a pooled connection before reuse."""
        if not self._poll.poll(0):
            return True
        sock = self.sock
        if not isinstance(sock, ssl.SSLSocket):
            return False  # end of stream, or bytes before any request: out of step
        sock.settimeout(0.0)  # readable: maybe only a TLS 1.3 session ticket
        try:
            sock.recv(1)
        except ssl.SSLWantReadError:
            return True
        except OSError:
            return False
        finally:
            sock.settimeout(None)
        return False

    def _set_timeout(self, seconds: float) -> None:
        micros = max(int(seconds * 1e6), 1)  # a zero timeval would mean "wait forever"
        value = struct.pack("ll", micros // 1_000_000, micros % 1_000_000)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self.timeout = seconds

    def exchange(self, request: bytes, timeout: float, deadline: float) -> tuple[int, bytes, bool]:
        """Send ``request``, read one response: (status, body, keep-alive). The first
        read waits up to ``timeout``; any later one only until ``deadline``."""
        if self.timeout != timeout:
            self._set_timeout(timeout)
        sock = self.sock
        sock.sendall(request)
        data = sock.recv(_RECV)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        result = parse_whole(data)
        if result is None:
            parser = ResponseParser()
            while (result := parser.feed(data)) is None:
                data = self._more(deadline)
        return result

    def _more(self, deadline: float) -> bytes:
        """The next read, waiting no later than ``deadline``."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._set_timeout(left)
        got = self.sock.recv(_RECV)
        if not got:
            raise ConnectionResetError("the server closed the connection mid-response")
        return got

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


_C = TypeVar("_C", "_Connection", "_AsyncConnection")


class _Gateway(Generic[_C]):
    """What both transports share: the gateway's address, TLS settings, request heads,
    the pool of idle connections (of type ``_C``) and its count of connections opened."""

    def __init__(
        self,
        address: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self.address = address
        try:  # smockron's one host:port parser; the clients raise ValueError for bad arguments
            self._host, self._port = parse_host_port(address)
        except ConfigError as exc:
            raise ValueError(f"HTTP gateway {exc}") from None
        self._ssl = ssl_context
        self._server_hostname = server_hostname or self._host
        self._heads: dict[str, bytes] = {}
        self._host_header = address.strip().encode("ascii")
        self._closed = False
        self._idle: list[_C] = []
        self._busy: set[_C] = set()
        """Connections in a call (the asyncio transport's ``close`` fails their calls)."""
        self.connections = 0
        """Connections opened so far (keep-alive: stays at one for a sequential caller)."""

    def _request(self, path: str, body: bytes) -> bytes:
        """The bytes of ``POST path`` with ``body``."""
        head = self._heads.get(path)
        if head is None:
            head = self._heads[path] = (
                b"POST " + path.encode("ascii") + b" HTTP/1.1\r\nHost: " + self._host_header
                + b"\r\nContent-Type: application/json\r\nContent-Length: "
            )  # fmt: skip
        return b"%s%d\r\n\r\n%s" % (head, len(body), body)

    def _answer(self, status: int, answer: bytes) -> bytes:
        if status != 200:
            raise gateway_error(status, answer)
        return answer

    def _raise(self, exc: BaseException) -> NoReturn:
        """``exc`` as the CallError it means (others as they are)."""
        failure = _failure(exc, self.address)
        if failure is exc:
            raise exc
        raise failure from exc


class HttpTransport(_Gateway["_Connection"]):
    """POSTs to one gateway address over kept-alive HTTP/1.1 connections, safe to share
    between threads: each call takes an idle connection (or opens one) and puts it back
    after the response, so concurrent calls use as many connections as run at once and
    a sequential caller reuses one. A connection the server closed while idle is noticed
    before use and replaced; one that fails mid-call is closed, never reused."""

    def post(self, path: str, body: bytes, timeout: float) -> bytes:
        """The body of the 200 answer to ``POST path``; CallError otherwise."""
        request = self._request(path, body)
        deadline = time.monotonic() + timeout
        conn = self._take(deadline)
        try:
            status, answer, keep = conn.exchange(request, timeout, deadline)
        except BaseException as exc:
            conn.close()
            self._raise(exc)
        if keep and not self._closed:
            self._idle.append(conn)
        else:
            conn.close()
        return self._answer(status, answer)

    def _take(self, deadline: float) -> _Connection:
        """An idle connection still open, else a new one."""
        idle = self._idle
        while idle:
            try:
                conn = idle.pop()
            except IndexError:  # another thread took the last one
                break
            if conn.alive():
                return conn
            conn.close()
        if self._closed:
            raise CallError(UNAVAILABLE, "the client is closed")
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection(
                (self._host, self._port), timeout=max(deadline - time.monotonic(), 1e-3)
            )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._server_hostname)
        except BaseException as exc:
            if sock is not None:
                sock.close()
            self._raise(exc)
        self.connections += 1
        return _Connection(sock)

    def close(self) -> None:
        """Closes the idle connections; those in use close when their call returns."""
        self._closed = True
        while self._idle:
            try:
                self._idle.pop().close()
            except IndexError:
                break


class _AsyncConnection(asyncio.Protocol):
    """One connection on the event loop, a bare Protocol (no streams): the loop hands each
    read to ``data_received``, which parses it and completes the call's future. Bytes,
    end of stream or a loss while no call waits mark it closed, so the pool drops it."""

    def __init__(self, tls: bool) -> None:
        self._tls = tls
        self.transport: asyncio.Transport | None = None
        self.open = True
        """False once the server closed it, it failed, or it is out of step."""
        self._future: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._parser: ResponseParser | None = None
        self._poll: select.poll | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and not self._tls:
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN)

    def alive(self) -> bool:
        """False when the server closed the idle connection. The loop may not have run
        since (a caller that never awaited in between), so a plain socket is also looked
        at without waiting, as the sync transport does; on TLS readable bytes may be a
        session ticket, so there only what the loop saw counts."""
        # readable while idle: end of stream, or bytes before any request (out of step)
        return self.open and not (self._poll is not None and self._poll.poll(0))

    def exchange(self, request: bytes, future: asyncio.Future[tuple[int, bytes, bool]]) -> None:
        """Send ``request``; ``future`` gets (status, body, keep-alive) or a failure."""
        assert self.transport is not None
        self._future = future
        self._parser = None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        future = self._future
        if future is None or future.done():  # unasked bytes, or after the deadline
            self._fail(None)
            return
        try:
            parser = self._parser
            if parser is None:
                result = parse_whole(data)
                if result is None:
                    parser = self._parser = ResponseParser()
                    result = parser.feed(data)
            else:
                result = parser.feed(data)
        except CallError as exc:
            self._fail(exc)
            return
        if result is not None:
            self._future = self._parser = None
            future.set_result(result)

    def eof_received(self) -> bool:
        self._fail(ConnectionResetError("the server closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("the server closed the connection"))

    def _fail(self, exc: BaseException | None) -> None:
        """Close for good; the waiting call, if any, fails with ``exc``."""
        self.open = False
        future, self._future = self._future, None
        if future is not None and not future.done() and exc is not None:
            future.set_exception(exc)
        self.close()

    def expire(self) -> None:
        """The call's deadline passed."""
        self._fail(TimeoutError())

    def close(self) -> None:
        self.open = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class AsyncHttpTransport(_Gateway["_AsyncConnection"]):
    """``HttpTransport`` for asyncio: the same requests, parser and errors, over a pool of
    ``_AsyncConnection`` on the running loop (asyncio's or uvloop's); create and use it
    inside one loop. A sequential caller reuses one connection, concurrent calls take one
    each. Each call's deadline is one loop timer."""

    async def post(self, path: str, body: bytes, timeout: float) -> bytes:
        """The body of the 200 answer to ``POST path``; CallError otherwise."""
        request = self._request(path, body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await self._take(loop, deadline)
        future: asyncio.Future[tuple[int, bytes, bool]] = loop.create_future()
        timer = loop.call_at(deadline, conn.expire)
        self._busy.add(conn)
        try:
            conn.exchange(request, future)
            status, answer, keep = await future
        except BaseException as exc:  # a cancelled caller too: the answer is still due
            conn.close()
            self._raise(exc)
        finally:
            timer.cancel()
            self._busy.discard(conn)
        if keep and conn.open and not self._closed:
            self._idle.append(conn)
        else:
            conn.close()
        return self._answer(status, answer)

    async def _take(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _AsyncConnection:
        """An idle connection still open, else a new one."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.alive():
                return conn
            conn.close()
        if self._closed:
            raise CallError(UNAVAILABLE, "the client is closed")
        try:
            async with asyncio.timeout_at(deadline):
                _, conn = await loop.create_connection(
                    partial(_AsyncConnection, self._ssl is not None),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._server_hostname if self._ssl else None,
                )
        except BaseException as exc:
            self._raise(exc)
        self.connections += 1
        return conn

    def close(self) -> None:
        """Closes every connection; calls in flight fail with UNAVAILABLE."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()
        for conn in list(self._busy):
            conn._fail(CallError(UNAVAILABLE, "the client is closed"))


def _failure(exc: BaseException, address: str) -> BaseException:
    """The CallError an exception during a call means (others pass through)."""
    if isinstance(exc, CallError):
        return exc
    # a kernel timeout (SO_RCVTIMEO, SO_SNDTIMEO) is EAGAIN: BlockingIOError, or on TLS
    # SSLWantReadError/SSLWantWriteError; socket.timeout (connect) is TimeoutError
    if isinstance(exc, TimeoutError | BlockingIOError | ssl.SSLWantReadError
                  | ssl.SSLWantWriteError):  # fmt: skip
        return CallError(DEADLINE_EXCEEDED, "Deadline Exceeded")
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return CallError(UNAVAILABLE, f"TLS with {address} failed: {exc}")
    if isinstance(exc, OSError):
        return CallError(UNAVAILABLE, f"connection to {address} failed: {exc}")
    return exc
