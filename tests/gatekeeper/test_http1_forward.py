"""The proxy's forwarding rules on their own: the head sent upstream, the response
header lines sent back."""

from __future__ import annotations

import httptools
import pytest

from smockron.gatekeeper._http1_forward import Request, request_head, response_fields


@pytest.mark.parametrize(
    ("fields", "kept", "length", "chunked"),
    [
        (b"", b"", False, False),
        (b"\r\nServer: x\r\nContent-Length: 6", b"\r\nServer: x\r\nContent-Length: 6", True, False),
        (b"\r\nContent-Length: 6\r\nConnection: keep-alive", b"\r\nContent-Length: 6", True, False),
        (b"\r\nTransfer-Encoding: chunked\r\nX-A: 1", b"\r\nX-A: 1", False, True),
        (
            b"\r\nkeep-alive: timeout=5\r\nTE: trailers\r\nTrailer: X\r\nUpgrade: h2c\r\nX-Te: 1",
            b"\r\nX-Te: 1",
            False,
            False,
        ),
        (
            b"\r\nConnection: X-Hop, x-other\r\nX-Hop: a\r\nX-Other: b\r\nX-Kept: c",
            b"\r\nX-Kept: c",
            False,
            False,
        ),
        # Connection cannot take the framing away
        (
            b"\r\nConnection: content-length\r\nContent-Length: 2",
            b"\r\nContent-Length: 2",
            True,
            False,
        ),
    ],
)
def test_response_fields(fields: bytes, kept: bytes, length: bool, chunked: bool) -> None:
    assert response_fields(fields) == (kept, length, chunked)


def _parsed(raw: bytes, peer: str = "192.0.2.7") -> Request:
    """``raw`` through llhttp into a Request, as the client connection fills it."""
    req = Request(peer)

    class Callbacks:
        def on_url(self, url: bytes) -> None:
            req.url += url

        def on_header(self, name: bytes, value: bytes) -> None:
            req.headers.append((name.lower(), name, value))
            if name.lower() == b"host":
                req.host = value
            elif name.lower() == b"connection":
                req.dropped = {t.strip().lower() for t in value.split(b",")}

    parser = httptools.HttpRequestParser(Callbacks())
    parser.feed_data(raw)
    req.set_verb(parser.get_method())
    return req


def test_request_head_rewrites_what_is_the_proxys() -> None:
    req = _parsed(
        b"GET http://example.com/a?b=c HTTP/1.1\r\nHost: example.com\r\nX-Forwarded-For: 1.2.3.4"
        b"\r\nConnection: x-hop\r\nX-Hop: 1\r\nUser-Agent: t\r\nX-Forwarded-Proto: https\r\n\r\n"
    )
    head = request_head(req, b"/base", b"up:80", b"192.0.2.7", b"proxy:8080")
    assert head == (
        b"GET /base/a?b=c HTTP/1.1\r\nHost: up:80\r\nUser-Agent: t\r\nX-Forwarded-Proto: https"
        b"\r\nX-Forwarded-For: 1.2.3.4, 192.0.2.7\r\nX-Forwarded-Host: example.com\r\n\r\n"
    )
    assert req.method == "GET" and req.path == "/a" and req.header("user-agent") == "t"


def test_request_head_without_a_host() -> None:
    req = _parsed(b"DELETE /%7Ex HTTP/1.0\r\nX-A: 1\r\nx-a: 2\r\n\r\n")
    head = request_head(req, b"", b"up", b"unknown", b"proxy:8080")
    assert head == (
        b"DELETE /%7Ex HTTP/1.1\r\nHost: up\r\nX-A: 1\r\nx-a: 2\r\nX-Forwarded-For: unknown"
        b"\r\nX-Forwarded-Host: proxy:8080\r\nX-Forwarded-Proto: http\r\n\r\n"
    )
    assert req.path == "/~x" and req.header("x-a") == "1, 2" and req.header("x-b") is None
