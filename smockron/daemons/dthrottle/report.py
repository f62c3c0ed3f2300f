"""The DThrottle peer report datagram, version 1: compact, versioned, split to fit.

Every report interval a daemon sends the tags it served since its last report with
their hit counts. A report too large for one datagram is split into parts; each part
stands alone (a lost part loses only its own tags), so receivers apply parts as they
arrive. All integers in the header are big-endian::

    offset size  field
    0      2     magic    b"DT"
    2      1     version  1
    3      1     flags    0 (reserved; ignored by version 1 readers)
    4      8     sender   random id chosen at start: drops our own multicast echo
    12     4     seq      report number of this sender, +1 per report
    16     2     part     index of this datagram in the report, 0-based
    18     2     parts    number of datagrams in the report (>= 1)
    20     ...   entries  until the end of the datagram, each:
                          varint tag length, tag bytes, varint hit count (>= 1)

Varints are unsigned LEB128 (7 bits a byte, low first, high bit = more), at most 10
bytes. A datagram that breaks any rule is rejected whole with :class:`ProtocolError`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from smockron.errors import ConfigError, ProtocolError

MAGIC = b"DT"
VERSION = 1
HEADER = struct.Struct("!2sBBQIHH")
MAX_PARTS = 0xFFFF
MAX_VARINT = 10
DEFAULT_MAX_DATAGRAM = 1400  # fits an Ethernet MTU of 1500 with IPv4 and UDP headers
MAX_UDP_PAYLOAD = 65507


@dataclass(frozen=True, slots=True)
class ReportPart:
    """One decoded datagram: part ``part`` of ``parts`` of report ``seq`` from ``sender``."""

    sender: int
    seq: int
    part: int
    parts: int
    hits: dict[bytes, int]


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"varint must be >= 0, got {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _entry(tag: bytes, count: int) -> bytes:
    return encode_varint(len(tag)) + tag + encode_varint(count)


def max_entry_size(max_tag_length: int) -> int:
    """The largest entry a tag of ``max_tag_length`` can need (any hit count)."""
    return len(encode_varint(max_tag_length)) + max_tag_length + MAX_VARINT


def check_sizes(max_tag_length: int, max_datagram: int) -> None:
    """Refuse settings under which one tag could not fit one datagram."""
    if not HEADER.size + max_entry_size(1) <= max_datagram <= MAX_UDP_PAYLOAD:
        raise ConfigError(f"max datagram must be 32..{MAX_UDP_PAYLOAD} bytes, got {max_datagram}")
    if HEADER.size + max_entry_size(max_tag_length) > max_datagram:
        raise ConfigError(
            f"max tag length {max_tag_length} does not fit a datagram of {max_datagram} bytes: "
            f"raise the datagram size or lower the tag length"
        )


def _chunks(hits: Mapping[bytes, int], room: int) -> Iterator[bytes]:
    chunk: list[bytes] = []
    size = 0
    for tag, count in hits.items():
        entry = _entry(tag, count)
        if len(entry) > room:
            raise ValueError(f"tag of {len(tag)} bytes does not fit a datagram")
        if size + len(entry) > room:
            yield b"".join(chunk)
            chunk, size = [], 0
        chunk.append(entry)
        size += len(entry)
    if chunk:
        yield b"".join(chunk)


def encode_report(
    sender: int, seq: int, hits: Mapping[bytes, int], max_datagram: int = DEFAULT_MAX_DATAGRAM
) -> list[bytes]:
    """The datagrams of one report; an empty report is no datagram at all.

    Beyond ``MAX_PARTS`` datagrams the rest is dropped: that costs accuracy, never
    availability, and would take a report of ~90 MB.
    """
    bodies = list(_chunks(hits, max_datagram - HEADER.size))[:MAX_PARTS]
    seq &= 0xFFFFFFFF
    return [
        HEADER.pack(MAGIC, VERSION, 0, sender, seq, index, len(bodies)) + body
        for index, body in enumerate(bodies)
    ]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(pos, min(pos + MAX_VARINT, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    if len(data) - pos >= MAX_VARINT:
        raise ProtocolError("bad_varint", f"varint at offset {pos} is longer than 10 bytes")
    raise ProtocolError("truncated", f"datagram ends inside a varint at offset {pos}")


def decode_report(data: bytes, max_tag_length: int = 1024) -> ReportPart:
    """Parse one datagram; any deviation raises ProtocolError with a short reason."""
    if len(data) < HEADER.size:
        raise ProtocolError("short", f"{len(data)} bytes is shorter than the 20-byte header")
    magic, version, _flags, sender, seq, part, parts = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError("bad_magic", f"magic {magic!r} is not {MAGIC!r}")
    if version != VERSION:
        raise ProtocolError("bad_version", f"version {version} is not supported (only {VERSION})")
    if not part < parts:
        raise ProtocolError("bad_part", f"part {part} of {parts}")
    hits: dict[bytes, int] = {}
    pos = HEADER.size
    end = len(data)
    while pos < end:
        length, pos = _varint(data, pos)
        if length > max_tag_length:
            raise ProtocolError("tag_too_long", f"tag of {length} bytes > {max_tag_length}")
        if pos + length > end:
            raise ProtocolError("truncated", f"tag of {length} bytes runs past the datagram end")
        tag = data[pos : pos + length]
        count, pos = _varint(data, pos + length)
        if count < 1:
            raise ProtocolError("bad_count", f"hit count 0 for tag {tag[:64]!r}")
        hits[tag] = hits.get(tag, 0) + count
    if not hits:
        raise ProtocolError("empty", "a report datagram without entries")
    return ReportPart(sender, seq, part, parts, hits)


class PeerLedger:
    """Drops duplicate and stale parts per sender, and counts reports we never saw.

    A duplicate happens when a peer reaches us by two transports (multicast and the
    unicast list) or the network repeats a datagram; applying it twice would charge twice.
    """

    def __init__(self, max_senders: int = 4096) -> None:
        self._latest: dict[int, tuple[int, set[int]]] = {}
        self._max_senders = max_senders
        self.missed_reports = 0

    def accept(self, part: ReportPart) -> bool:
        """True the first time a (sender, seq, part) is seen and seq is not older."""
        latest = self._latest.get(part.sender)
        if latest is None:
            if len(self._latest) >= self._max_senders:  # bogus sender ids cannot fill memory
                del self._latest[next(iter(self._latest))]
            self._latest[part.sender] = (part.seq, {part.part})
            return True
        seq, seen = latest
        ahead = (part.seq - seq) & 0xFFFFFFFF
        if ahead == 0:
            if part.part in seen:
                return False
            seen.add(part.part)
            return True
        if ahead >= 0x80000000:  # older than the latest report: stale or replayed
            return False
        self.missed_reports += ahead - 1
        self._latest[part.sender] = (part.seq, {part.part})
        return True

    @property
    def peers(self) -> int:
        return len(self._latest)
