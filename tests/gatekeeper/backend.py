"""A small real HTTP/1.1 backend in a thread that echoes what it received."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support import free_port


@dataclass
class Seen:
    connections: set[tuple[str, int]] = field(default_factory=set)
    arrivals: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, x-client)
    first_chunks: list[float] = field(default_factory=list)  # monotonic, per chunked body
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: Seen

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if not out and size:
                    with self.seen.lock:
                        self.seen.first_chunks.append(time.monotonic())
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._body()
        with self.seen.lock:
            self.seen.connections.add(self.client_address)
            self.seen.arrivals.append((time.monotonic(), self.headers.get("x-client", "")))
        if self.path.startswith(("/stream", "/slow")):
            # /slow: two chunks 0.6 s apart, to tell streaming from buffering
            pause, count = (0.6, 2) if self.path.startswith("/slow") else (0.02, 5)
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "X-Upstream-Hop")
            self.send_header("X-Upstream-Hop", "secret")
            self.end_headers()
            for i in range(count):
                chunk = b"chunk%d\n" % i
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                time.sleep(pause)
            self.wfile.write(b"0\r\n\r\n")
            return
        status = 404 if self.path.startswith("/missing") else 200
        payload = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "length": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
            }
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # a burst of connections is not dropped (the default: 5)


@contextlib.contextmanager
def backend() -> Iterator[tuple[int, Seen]]:
    seen = Seen()
    handler = type("Handler", (_Handler,), {"seen": seen})
    port = free_port()
    server = _Server(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield port, seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
