"""Hostile input for every smockron listener, shared by ``bench/soak.py`` and its test.

Each generator takes a seeded ``random.Random`` and returns one message shaped for one
listener: random bytes, truncated and oversized frames, wrong frame counts (more than
16 too), huge lengths and numbers, invalid UTF-8, and NUL, ESC, CR and newline in every
field, plus valid-looking messages whose values are hostile. Every newline the fuzz
writes is followed by ``FORGED`` so a test can tell a forged log line from a real one.

Pure: no I/O. Deterministic for a seed, so a failure can be replayed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

FORGED = b"FORGED"
"""Follows every newline the fuzz writes: a log line starting with it was forged."""

NASTY: tuple[bytes, ...] = (
    b"\n" + FORGED,
    b"\r\n" + FORGED,
    b"\x1b[31m",
    b"\x00",
    b"\xff\xfe",  # invalid UTF-8
    b"\xc3",  # truncated UTF-8 sequence
    b"\xed\xa0\x80",  # a UTF-16 surrogate in UTF-8: invalid
    b"\xe2\x80\xa8",  # LINE SEPARATOR
    b"%s%d%n",
    b"{}",
    b"\t",
    b"\x7f",
)
"""Pieces that break parsers and logs."""

HUGE_NUMBERS: tuple[bytes, ...] = (
    b"9" * 17,
    b"9" * 400,
    b"99999999999999999999",
    b"-1",
    b"+1",
    b"1e9",
    b"0x10",
    b" 1",
    b"1 ",
    b"NaN",
    b"inf",
    b"",
    b"\xd9\xa3",  # ARABIC-INDIC DIGIT THREE: isdigit() in str, not in bytes
    b"253402300800000",  # just past year 9999
)

Frames = list[bytes]


def nasty(rng: random.Random, max_len: int = 64) -> bytes:
    """Some random bytes with hostile pieces in them."""
    parts = [rng.randbytes(rng.randrange(0, max_len // 4 + 1))]
    for _ in range(rng.randrange(1, 4)):
        parts.append(rng.choice(NASTY))
        parts.append(rng.randbytes(rng.randrange(0, 8)))
    return b"".join(parts)


def field(rng: random.Random, valid: bytes) -> bytes:
    """A frame or field: usually hostile, sometimes oversized, sometimes a valid one."""
    roll = rng.random()
    if roll < 0.35:
        return nasty(rng)
    if roll < 0.45:
        return rng.choice(HUGE_NUMBERS)
    if roll < 0.50:
        return rng.randbytes(rng.choice((257, 1025, 8193)))  # past a decoder's limits
    if roll < 0.60:
        return valid[: rng.randrange(0, len(valid) + 1)]  # truncated
    if roll < 0.70:
        return valid + nasty(rng, 8)
    return valid


def frames(rng: random.Random, valid: Frames) -> Frames:
    """A ZeroMQ message made from ``valid``: fields mangled, frames dropped or added
    (up to 40, past the 16 a reader keeps), or random bytes altogether."""
    roll = rng.random()
    if roll < 0.001:  # past a master's frame limit: it drops the connection
        return [rng.randbytes(70_000)]
    if roll < 0.10:
        return [rng.randbytes(rng.randrange(0, 200))]
    if roll < 0.20:
        return [nasty(rng) for _ in range(rng.randrange(17, 41))]
    out = [field(rng, f) if rng.random() < 0.4 else f for f in valid]
    if roll < 0.35:
        del out[rng.randrange(1, len(out)) :]
    elif roll < 0.45:
        out.extend(nasty(rng) for _ in range(rng.randrange(1, 4)))
    return out


def accounting(rng: random.Random, domain: bytes, now_ms: int) -> Frames:
    """Hostile accounting for a master (``domain`` is one it has rules for)."""
    status = rng.choice((b"ACCEPTED", b"DELAYED", b"REJECTED"))
    delayed = b"%d" % (now_ms + 500) if status == b"DELAYED" else b""
    valid = [domain + b"\0", status, nasty(rng, 32), b"%d" % now_ms, delayed, nasty(rng)]
    return frames(rng, valid[: rng.choice((5, 6))])


def control(rng: random.Random, domain: bytes, now_ms: int) -> Frames:
    """Hostile control messages for a gatekeeper (DELAY_UNTILs, a rules offer)."""
    if rng.random() < 0.1:
        offer = [b"\0smockron\0", b"RULES", domain, nasty(rng, 16), nasty(rng, 16)]
        return frames(rng, offer)
    until = rng.choice((now_ms + 100, now_ms + 86_400_001, 253_402_300_799_999, now_ms - 1))
    return frames(rng, [domain + b"\0", b"DELAY_UNTIL", nasty(rng, 32), b"%d" % until])


def tag_lines(rng: random.Random, max_tag: int) -> bytes:
    """Hostile DThrottle queries: a few lines of nasty tags, sometimes one overlong
    (which closes the connection) or a line left unfinished."""
    lines = [nasty(rng, 48).replace(b"\n", b"\\n") for _ in range(rng.randrange(1, 8))]
    roll = rng.random()
    if roll < 0.03:
        lines.append(rng.randbytes(max_tag + 1 + rng.randrange(0, 5000)).replace(b"\n", b"."))
    data = b"\n".join(lines) + b"\n"
    if roll > 0.97:
        data += nasty(rng)  # no newline: left in the buffer
    return data


def json_value(rng: random.Random, depth: int = 0) -> object:
    """A random JSON value, hostile strings and numbers included."""
    roll = rng.random()
    if depth > 3 or roll < 0.3:
        return rng.choice(
            [
                nasty(rng).decode("utf-8", "surrogateescape"),
                rng.choice(HUGE_NUMBERS).decode("latin-1"),
                -1,
                2**70,
                1e308,
                None,
                True,
                "TOKEN_BUCKET",
                "LEAKY_BUCKET",
                "GLOBAL",
                "NOPE\n" + FORGED.decode(),
            ]
        )
    if roll < 0.6:
        return [json_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    keys = [
        "name",
        "uniqueKey",
        "hits",
        "limit",
        "duration",
        "algorithm",
        "behavior",
        "burst",
        "metadata",
        "createdAt",
        "requests",
        nasty(rng, 8).decode("latin-1"),
    ]
    return {rng.choice(keys): json_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))}


def rate_limit_json(rng: random.Random) -> bytes:
    """A hostile body for POST /v1/GetRateLimits."""
    roll = rng.random()
    if roll < 0.15:
        return nasty(rng, 200)
    if roll < 0.20:
        return b"[" * rng.randrange(1000, 5000)  # nesting past the recursion limit
    if roll < 0.50:
        return json.dumps(json_value(rng)).encode("utf-8", "surrogateescape")
    item = {
        "name": rng.choice(["t", nasty(rng, 16).decode("latin-1")]),
        "uniqueKey": nasty(rng, 32).decode("latin-1"),
        "hits": json_value(rng, 4),
        "limit": rng.choice(["10", "-5", "9" * 30, 10, "x\n" + FORGED.decode()]),
        "duration": rng.choice(["60000", "0", "-1", "9" * 25]),
        "algorithm": rng.choice(["TOKEN_BUCKET", "LEAKY_BUCKET", "BOGUS\x1b[2J", 7, -1]),
        "behavior": rng.choice(["BATCHING", "GLOBAL", "NO_SUCH\n" + FORGED.decode(), 1 << 40]),
    }
    body = {"requests": [item] * rng.choice((1, 1, 2, 1001))}
    return json.dumps(body).encode("utf-8", "surrogateescape")


def raw_http(rng: random.Random, host: str) -> bytes:
    """Bytes that are not quite HTTP: bad request lines, headers, lengths, chunks."""
    choices: list[Callable[[], bytes]] = [
        lambda: nasty(rng, 300) + b"\r\n\r\n",
        lambda: (
            b"POST /v1/GetRateLimits HTTP/1.1\r\nHost: "
            + host.encode()
            + b"\r\nContent-Length: 99999999999999999999\r\n\r\n{}"
        ),
        lambda: (
            b"POST /v1/GetRateLimits HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"zz\r\n"
            + nasty(rng)
            + b"\r\n0\r\n\r\n"
        ),
        lambda: b"GET /" + nasty(rng, 40) + b" HTTP/1.1\r\n\r\n",
        lambda: b"GET / HTTP/1.1\r\nX-" + nasty(rng, 20) + b": " + nasty(rng) + b"\r\n\r\n",
        lambda: b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
        lambda: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + rng.randbytes(50),
    ]
    return rng.choice(choices)()


GRPC_METHODS: tuple[str, ...] = (
    "/pb.gubernator.V1/GetRateLimits",
    "/pb.gubernator.V1/HealthCheck",
    "/pb.gubernator.V1/LiveCheck",
    "/pb.gubernator.PeersV1/GetPeerRateLimits",
    "/pb.gubernator.PeersV1/UpdatePeerGlobals",
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
)


def grpc_call(rng: random.Random) -> tuple[str, bytes]:
    """A method path (sometimes unknown or hostile) and a request body that is random
    bytes, a truncated protobuf, or a field with a huge length prefix."""
    roll = rng.random()
    if roll < 0.1:
        method = "/" + nasty(rng, 20).decode("ascii", "replace").replace("\n", "_")
        method = "".join(c if c.isprintable() and c != "\ufffd" else "_" for c in method)
    elif roll < 0.15:
        method = "/pb.gubernator.V1/NoSuchMethod"
    else:
        method = rng.choice(GRPC_METHODS)
    kind = rng.random()
    if kind < 0.4:
        body = rng.randbytes(rng.randrange(0, 300))
    elif kind < 0.6:
        body = b"\x0a\xff\xff\xff\xff\x0f" + rng.randbytes(10)  # length 4 GiB, 10 bytes
    else:  # a GetRateLimitsReq with one item: name, unique_key (hostile), hits, limit
        key = nasty(rng, 30)
        key = key[:100]
        item = b"\x0a\x01t\x12" + bytes([len(key)]) + key + b"\x18" + bytes([rng.randrange(128)])
        body = b"\x0a" + bytes([len(item)]) + item
        body = body[: rng.randrange(1, len(body) + 1)] if kind < 0.8 else body
    return method, body
