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

The codecs, pure, are smockron.cluster.client._httpcodec; here are the pools of
connections that only move bytes: ``HttpTransport`` (blocking sockets, the sync
Client's) and ``AsyncHttpTransport`` (asyncio Protocols, the AsyncClient's). Every read
has the call's deadline: a hostile or stuck server gives a ``CallError``, never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
import struct
import time
from functools import partial
from typing import Generic, NoReturn, TypeVar, cast

from smockron.cluster.client._httpcodec import (
    DEADLINE_EXCEEDED,
    UNAVAILABLE,
    CallError,
    ResponseParser,
    gateway_error,
    parse_whole,
)
from smockron.errors import ConfigError
from smockron.settings import parse_host_port

_RECV = 64 * 1024


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
                b"POST "
                + path.encode("ascii")
                + b" HTTP/1.1\r\nHost: "
                + self._host_header
                + b"\r\nContent-Type: application/json\r\nContent-Length: "
            )
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
    if isinstance(
        exc, TimeoutError | BlockingIOError | ssl.SSLWantReadError | ssl.SSLWantWriteError
    ):
        return CallError(DEADLINE_EXCEEDED, "Deadline Exceeded")
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return CallError(UNAVAILABLE, f"TLS with {address} failed: {exc}")
    if isinstance(exc, OSError):
        return CallError(UNAVAILABLE, f"connection to {address} failed: {exc}")
    return exc
