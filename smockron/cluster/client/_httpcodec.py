"""The pure codecs of the clients' HTTP/1.1 transport (smockron.cluster.client._http):
the gateway's GetRateLimits JSON (``encode_requests``, ``decode_responses``,
``gateway_error``) and HTTP/1.1 response framing (``parse_head``, ``parse_whole``,
``ResponseParser``), no I/O. The response parser treats the bytes as hostile: head and
body sizes are bounded, framing is Content-Length or chunked only, every field is
type-checked, and anything else is a ``CallError`` with code INTERNAL.

Failures are ``CallError(code, details)`` with gRPC status code numbers, as the native
channel raises, so the Client maps both to the same ClientError types: refused or broken
connections are UNAVAILABLE, a passed deadline DEADLINE_EXCEEDED, and a gateway error
body ``{"code": n, "message": ...}`` keeps the server's own code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Sequence
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from smockron.cluster.model import RateLimitRequest, RateLimitResponse, Status

MAX_HEAD = 64 * 1024
"""Bytes of status line and headers accepted in one response."""
MAX_RESPONSE_BODY = 32 * 1024 * 1024
"""Bytes of body accepted (1,000 answers with some metadata fit many times over)."""

# gRPC status codes (grpc.StatusCode values), as numbers so the codecs import no grpc
UNKNOWN, DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE = 2, 4, 13, 14
# HTTP statuses without a gateway error body, as gRPC's "HTTP to gRPC status" table
_HTTP_CODES = {
    400: INTERNAL,
    401: 16,
    403: 7,
    404: 12,
    429: UNAVAILABLE,
    502: UNAVAILABLE,
    503: UNAVAILABLE,
    504: UNAVAILABLE,
}

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
    length, keep = _framing(head, eol, version == b"HTTP/1.1 ")
    return int(code), length, keep


def _framing(head: bytes, eol: int, keep: bool) -> tuple[int | None, bool]:
    """(Content-Length or None for chunked, keep-alive) from the header lines after
    ``eol``; ``keep``: the version's default."""
    length: int | None = None
    chunked = False
    for name, raw in _FRAMING.findall(head, eol):
        name, value = name.lower(), raw.strip(b" \t")
        if name == b"content-length":
            length = _content_length(value, length)
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
    return length, keep


def _content_length(value: bytes, seen: int | None) -> int:
    """A Content-Length value; several must agree (``seen``: an earlier one)."""
    if not value.isdigit() or len(value) > 12 or (seen is not None and int(value) != seen):
        raise _bad(f"Content-Length {value[:100]!r}")
    return int(value)


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
            chunk, pos = yield from self._chunk_size(pos)
            size += chunk
            if size > MAX_RESPONSE_BODY:
                raise _bad(f"chunked body over {MAX_RESPONSE_BODY} bytes")
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

    def _chunk_size(self, pos: int) -> Generator[None, None, tuple[int, int]]:
        """(size, offset of its data) of the chunk whose size line starts at ``_buf[pos]``."""
        buf = self._buf
        scanned = pos
        while (eol := buf.find(b"\r\n", scanned)) < 0:
            if len(buf) - pos > 1024:
                raise _bad("chunk size line too long")
            scanned = max(len(buf) - 1, pos)
            yield
        line = bytes(buf[pos:eol]).partition(b";")[0].strip(b" \t")
        if not _HEX.fullmatch(line):
            raise _bad(f"chunk size {line[:100]!r}")
        return int(line, 16), eol + 2
