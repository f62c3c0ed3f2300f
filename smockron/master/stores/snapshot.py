"""The memory store's snapshot file, so that a restarted master does not forgive everyone.

Format (version 1), little-endian, compact and bounded by the states held::

    b"SMKSNAP" + version byte (1)
    per table:  b"T", u32 length + the scope's key prefix (algorithm:domain:rate:burst:),
                u32 count, then per state: u32 key length + key, u16 n + n float64
    b"E", u64 number of states, u32 CRC-32 of everything before it

A table is found again by its scope's prefix, so states of a rule changed meanwhile
are dropped (as a reload drops them). Written to ``PATH.tmp`` then renamed over
``PATH``: a crash mid-write leaves the previous snapshot whole. Both are mode 0600
whatever the umask: the file holds identifiers (API keys, addresses). A file that does not
parse (truncated, another version, a bad checksum) is refused whole.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

from smockron.master.stores.base import State

MAGIC = b"SMKSNAP"
VERSION = 1
MAX_STATE_LEN = 65_535
"""Floats per state (a history rule's burst); longer states are not written."""

_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_END = struct.Struct("<QI")


class SnapshotError(ValueError):
    """The file is not a snapshot this version can read; the message says why."""


Tables = Mapping[bytes, Iterable[tuple[bytes, State | bytes | float]]]


def encode(tables: Tables) -> bytes:
    """The snapshot of ``tables`` (scope prefix -> (identifier, state) pairs). A state
    may be given packed, as the memory store's history tables hold it (``bytes`` of
    little-endian float64s, the file's own form): written as it is, not unpacked; or
    as one float (a GCRA value)."""
    out = [MAGIC, bytes([VERSION])]
    total = 0
    for prefix, states in tables.items():
        body = []
        count = 0
        for key, state in states:
            if isinstance(state, float):  # a GCRA value, as the memory store holds it
                state = (state,)
            if isinstance(state, bytes):
                n, data = len(state) >> 3, state
            else:
                n, data = len(state), b""
            if not 0 < n <= MAX_STATE_LEN:
                continue
            body.append(_U32.pack(len(key)) + key + _U16.pack(n))
            body.append(data or struct.pack(f"<{n}d", *state))
            count += 1
        out += [b"T", _U32.pack(len(prefix)), prefix, _U32.pack(count), *body]
        total += count
    blob = b"".join(out) + b"E"
    return blob + _END.pack(total, zlib.crc32(blob))


def decode(blob: bytes) -> dict[bytes, dict[bytes, State]]:
    """Scope prefix -> identifier -> state; raises :class:`SnapshotError`."""
    if blob[: len(MAGIC)] != MAGIC:
        raise SnapshotError("not a smockron snapshot")
    if blob[len(MAGIC) : len(MAGIC) + 1] != bytes([VERSION]):
        raise SnapshotError(f"unknown version {blob[len(MAGIC) : len(MAGIC) + 1]!r}")
    if len(blob) < len(MAGIC) + 1 + 1 + _END.size:
        raise SnapshotError("truncated")
    body_end = len(blob) - _END.size
    total, crc = _END.unpack_from(blob, body_end)
    if zlib.crc32(blob[:body_end]) != crc or blob[body_end - 1 : body_end] != b"E":
        raise SnapshotError("bad checksum (truncated or altered)")
    try:
        tables = _tables(blob, len(MAGIC) + 1, body_end - 1)
    except (struct.error, IndexError) as exc:
        raise SnapshotError(f"malformed: {exc}") from None
    if sum(map(len, tables.values())) != total:
        raise SnapshotError("state count does not match")
    return tables


def _tables(blob: bytes, pos: int, end: int) -> dict[bytes, dict[bytes, State]]:
    tables: dict[bytes, dict[bytes, State]] = {}
    while pos < end:
        if blob[pos : pos + 1] != b"T":
            raise SnapshotError(f"bad record at byte {pos}")
        (size,) = _U32.unpack_from(blob, pos + 1)
        prefix = blob[pos + 5 : pos + 5 + size]
        pos += 5 + size
        (count,) = _U32.unpack_from(blob, pos)
        pos += 4
        states = tables.setdefault(prefix, {})
        for _ in range(count):
            (size,) = _U32.unpack_from(blob, pos)
            key = blob[pos + 4 : pos + 4 + size]
            pos += 4 + size
            (n,) = _U16.unpack_from(blob, pos)
            states[key] = struct.unpack_from(f"<{n}d", blob, pos + 2)
            pos += 2 + 8 * n
        if pos > end:
            raise SnapshotError("truncated table")
    return tables


def write(path: Path, blob: bytes) -> None:
    """Atomically: a temporary file beside ``path`` (owner-only: it holds identifiers),
    flushed, then renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as f:
        os.fchmod(fd, 0o600)  # a .tmp left by an older version may be 0644
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(path: Path) -> dict[bytes, dict[bytes, State]] | None:
    """The snapshot at ``path``; None when there is none yet."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode(blob)
