"""hashicorp/memberlist's wire format, the part smockron speaks: pure bytes in and out.

A message is one type byte, then one msgpack-encoded Go struct (net.go). Go's encoder
(hashicorp/go-msgpack, ``MsgpackHandle{}``) writes a struct as a map whose keys are the
field names sorted bytewise, skips ``omitempty`` fields that are empty, writes strings and
``[]byte`` alike as the old raw type (fixstr, str16, str32: never str8 or bin), a nil
``[]byte`` as nil, unsigned fields in their smallest unsigned form, and signed (``int``)
fields above 127 as int16/int32/int64. :func:`encode` writes the same bytes, so what a Go
node reads is what it would have sent. Decoding is as lenient as Go's: any integer or
raw form, keys in any order, unknown keys ignored; anything else is :class:`Malformed`.

A UDP packet may be a compound of messages (util.go), carry a CRC32 header (protocol 5),
or be LZW-compressed (``EnableCompression``, on in Gubernator's configuration): all are
read. With secret keys, packets and streams are AES-GCM encrypted (security.go). Labels
are not spoken: :func:`unwrap_packet` says so.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack  # type: ignore[import-untyped]
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.discovery.memberlist_lzw import LzwError, lzw_decode

# message types (net.go: "ONLY APPEND TO THIS LIST")
PING, INDIRECT_PING, ACK, SUSPECT, ALIVE, DEAD, PUSH_PULL, COMPOUND = range(8)
USER, COMPRESS, ENCRYPT, NACK, HAS_CRC, ERR = range(8, 14)
HAS_LABEL = 244

# NodeStateType (state.go)
STATE_ALIVE, STATE_SUSPECT, STATE_DEAD, STATE_LEFT = range(4)

VSN = bytes([1, 2, 2, 0, 0, 0])
"""Protocol min, max, current; delegate min, max, current. Max 2: peers then send no CRC
headers, TCP pings or nack requests, which protocol 3 to 5 added (all read anyway)."""

MAX_PUSH_NODES = 1024 * 1024
MAX_STATE_BYTES = 20 * 1024 * 1024
META_MAX_SIZE = 512


class Malformed(ValueError):
    """Bytes that are not a message memberlist would send."""


class Truncated(Malformed):
    """Not all of it yet: a stream reader reads more and tries again."""


# Go struct fields: name -> kind. u: unsigned, i: signed int, s: string, b: []byte,
# ?: bool. A trailing "~" marks ``codec:",omitempty"``.
STRUCTS: dict[str, dict[str, str]] = {
    "ping": {"SeqNo": "u", "Node": "s", "SourceAddr": "b~", "SourcePort": "u~", "SourceNode": "s~"},
    "indirect_ping": {
        "SeqNo": "u",
        "Target": "b",
        "Port": "u",
        "Node": "s",
        "Nack": "?",
        "SourceAddr": "b~",
        "SourcePort": "u~",
        "SourceNode": "s~",
    },
    "ack": {"SeqNo": "u", "Payload": "b"},
    "nack": {"SeqNo": "u"},
    "err": {"Error": "s"},
    "suspect": {"Incarnation": "u", "Node": "s", "From": "s"},
    "alive": {"Incarnation": "u", "Node": "s", "Addr": "b", "Port": "u", "Meta": "b", "Vsn": "b"},
    "dead": {"Incarnation": "u", "Node": "s", "From": "s"},
    "push_pull_header": {"Nodes": "i", "UserStateLen": "i", "Join": "?"},
    "push_node_state": {
        "Name": "s",
        "Addr": "b",
        "Port": "u",
        "Meta": "b",
        "Incarnation": "u",
        "State": "i",
        "Vsn": "b",
    },
    "compress": {"Algo": "u", "Buf": "b"},
}

_PACKER = msgpack.Packer(use_bin_type=False)


def _pack(value: Any) -> bytes:
    return bytes(_PACKER.pack(value))


def _uint(value: int) -> bytes:
    return _pack(value)  # msgpack-python picks the smallest unsigned form, as Go


def _int(value: int) -> bytes:
    """Go's EncodeInt: -32..127 fixed, larger positives int16/int32/int64 (not uint)."""
    if -32 <= value <= 127:
        return _pack(value)
    if 0 < value <= 0x7FFF:
        return b"\xd1" + struct.pack(">h", value)
    if 0 < value <= 0x7FFFFFFF:
        return b"\xd2" + struct.pack(">i", value)
    if value > 0:
        return b"\xd3" + struct.pack(">q", value)
    return _pack(value)  # negatives: the smallest signed form, as Go


def encode_struct(kind: str, values: Mapping[str, Any]) -> bytes:
    """One Go struct of ``kind`` (a STRUCTS key) as go-msgpack writes it."""
    fields = STRUCTS[kind]
    out = []
    for name in sorted(fields):
        spec = fields[name]
        value = values.get(name)
        if spec.endswith("~") and not value:
            continue
        out.append(_pack(name) + _value(spec[0], value))
    size = len(out)
    header = bytes([0x80 | size]) if size < 16 else b"\xde" + struct.pack(">H", size)
    return header + b"".join(out)


def _value(kind: str, value: Any) -> bytes:
    if kind == "u":
        return _uint(int(value or 0))
    if kind == "i":
        return _int(int(value or 0))
    if kind == "?":
        return _pack(bool(value))
    if kind == "s":
        return _pack(str(value or "").encode())
    return _pack(None if value is None else bytes(value))  # b: nil stays nil


def encode(msg_type: int, kind: str, values: Mapping[str, Any]) -> bytes:
    """A message: its type byte, then the struct (util.go ``encode``)."""
    return bytes([msg_type]) + encode_struct(kind, values)


def decode_struct(kind: str, obj: Any) -> dict[str, Any]:
    """A decoded msgpack map (raw=True: bytes keys) as the Go struct ``kind``, every field
    present: zero values for missing ones, as Go leaves them."""
    if not isinstance(obj, dict):
        raise Malformed(f"{kind}: not a map")
    fields = STRUCTS[kind]
    out: dict[str, Any] = {}
    for name, spec in fields.items():
        raw = obj.get(name.encode())
        out[name] = _field(kind, name, spec[0], raw)
    return out


_ZERO: dict[str, Any] = {"u": 0, "i": 0, "?": False, "s": "", "b": None}


def _field(kind: str, name: str, spec: str, raw: Any) -> Any:
    if raw is None:
        return _ZERO[spec]
    if spec in "ui":
        if not isinstance(raw, int) or isinstance(raw, bool) or (spec == "u" and raw < 0):
            raise Malformed(f"{kind}.{name}: not an integer")
        return raw
    if spec == "?":
        if not isinstance(raw, bool):
            raise Malformed(f"{kind}.{name}: not a bool")
        return raw
    if not isinstance(raw, bytes):
        raise Malformed(f"{kind}.{name}: not a string")
    if spec == "b":
        return raw
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise Malformed(f"{kind}.{name}: not UTF-8") from None


def decode(kind: str, body: bytes) -> dict[str, Any]:
    """The struct after a type byte."""
    try:
        obj = msgpack.unpackb(body, raw=True, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise Malformed(f"{kind}: {exc}") from None
    return decode_struct(kind, obj)


# -- packets ----------------------------------------------------------------------------


def make_compound(messages: list[bytes]) -> bytes:
    """util.go ``makeCompoundMessage``: type, count, each length (big-endian uint16), the
    messages (at most 255)."""
    lengths = b"".join(struct.pack(">H", len(m)) for m in messages)
    return bytes([COMPOUND, len(messages)]) + lengths + b"".join(messages)


def split_compound(body: bytes) -> tuple[list[bytes], int]:
    """util.go ``decodeCompoundMessage`` (after the type byte): the parts, and how many
    were truncated."""
    if not body:
        raise Malformed("missing compound length byte")
    count, body = body[0], body[1:]
    if len(body) < count * 2:
        raise Malformed("truncated len slice")
    lengths = struct.unpack(f">{count}H", body[: count * 2])
    body = body[count * 2 :]
    parts: list[bytes] = []
    for i, size in enumerate(lengths):
        if len(body) < size:
            return parts, count - i
        parts.append(body[:size])
        body = body[size:]
    return parts, 0


def unwrap_packet(packet: bytes, keys: Sequence[bytes] = (), verify: bool = True) -> bytes:
    """The message of a UDP packet (net.go ``ingestPacket``): a label header refused
    (smockron joins no labelled cluster), the packet decrypted with ``keys`` (a plaintext
    one accepted only without ``verify``), a CRC header checked and removed."""
    if packet[:1] == bytes([HAS_LABEL]):
        raise Malformed("labelled packet: no GUBER_* setting gives a memberlist label")
    if keys:
        try:
            packet = decrypt(keys, packet)
        except Malformed:
            if verify:
                raise
    if len(packet) >= 5 and packet[0] == HAS_CRC:
        if zlib.crc32(packet[5:]) != struct.unpack(">I", packet[1:5])[0]:
            raise Malformed("invalid checksum")
        return packet[5:]
    return packet


def messages(message: bytes, depth: int = 0) -> Iterator[tuple[int, bytes]]:
    """``(type, body)`` of each message in ``message``: compounds split, compressed ones
    expanded (net.go ``handleCommand``)."""
    if not message:
        raise Malformed("missing message type byte")
    kind, body = message[0], message[1:]
    if kind in (COMPOUND, COMPRESS) and depth > 2:
        raise Malformed("nested too deep")
    if kind == COMPOUND:
        parts, truncated = split_compound(body)
        if truncated:
            raise Malformed(f"compound message had {truncated} truncated messages")
        for part in parts:
            yield from messages(part, depth + 1)
    elif kind == COMPRESS:
        yield from messages(decompress(decode("compress", body)), depth + 1)
    else:
        yield kind, body


def decompress(compressed: Mapping[str, Any]) -> bytes:
    if compressed["Algo"] != 0:
        raise Malformed(f"cannot decompress unknown algorithm {compressed['Algo']}")
    try:
        return lzw_decode(compressed["Buf"] or b"", limit=2 * MAX_STATE_BYTES)
    except LzwError as exc:
        raise Malformed(str(exc)) from None


# -- encryption: security.go ------------------------------------------------------------

NONCE_SIZE, TAG_SIZE = 12, 16
ENCRYPT_OVERHEAD = 1 + NONCE_SIZE + TAG_SIZE
"""Version 1 (what nodes speaking protocol 2 or later write): no padding."""


def secret_keys(texts: Sequence[str]) -> list[bytes]:
    """GUBER_MEMBERLIST_SECRET_KEYS: base64 keys of 16, 24 or 32 bytes (AES-128, -192,
    -256); the first encrypts, all are tried to decrypt (memberlist.go, keyring.go)."""
    keys = []
    for i, text in enumerate(texts):
        try:
            key = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(
                f"unable to base64 decode memberlist encryption key at index {i}"
            ) from None
        if len(key) not in (16, 24, 32):
            raise ValueError(
                f"unable to add secret key at index {i} to memberlist: key size "
                "must be 16, 24 or 32 bytes"
            )
        keys.append(key)
    return keys


def encrypt(key: bytes, message: bytes, data: bytes = b"", nonce: bytes | None = None) -> bytes:
    """``encryptPayload`` version 1: the version byte, a random nonce, then AES-GCM's
    ciphertext and tag, ``data`` authenticated alongside."""
    nonce = os.urandom(NONCE_SIZE) if nonce is None else nonce
    return b"\x01" + nonce + AESGCM(key).encrypt(nonce, message, data)


def decrypt(keys: Sequence[bytes], payload: bytes, data: bytes = b"") -> bytes:
    """``decryptPayload``: versions 0 (PKCS7-padded) and 1, with each key in turn."""
    if not payload:
        raise Malformed("cannot decrypt empty payload")
    version = payload[0]
    if version > 1:
        raise Malformed(f"unsupported encryption version {version}")
    if len(payload) < ENCRYPT_OVERHEAD + (16 if version == 0 else 0):
        raise Malformed(f"payload is too small to decrypt: {len(payload)}")
    nonce, sealed = payload[1 : 1 + NONCE_SIZE], payload[1 + NONCE_SIZE :]
    for key in keys:
        try:
            plain = AESGCM(key).decrypt(nonce, sealed, data)
        except InvalidTag:
            continue
        if version == 0:
            pad = plain[-1] if plain else 0
            if not 1 <= pad <= 16 or len(plain) < pad:
                raise Malformed("bad padding")
            plain = plain[:-pad]
        return plain
    raise Malformed("no installed keys could decrypt the message")


def encrypt_stream(key: bytes, message: bytes) -> bytes:
    """net.go ``encryptLocalState``: the encrypt type, the encrypted length (big-endian
    uint32), the payload, which authenticates those five bytes (and the empty label)."""
    header = bytes([ENCRYPT]) + struct.pack(">I", ENCRYPT_OVERHEAD + len(message))
    return header + encrypt(key, message, header)


# -- node metadata: Gubernator's PeerInfo as JSON (memberlist.go) ---------------------------


def encode_meta(peer: PeerInfo) -> bytes:
    """``json.Marshal(&PeerInfo)``: Gubernator's field order and names, compact; smockron
    adds where it serves PeersV1 (Gubernator ignores the key)."""
    record = {
        "data-center": peer.data_center,
        "http-address": peer.http_address,
        "grpc-address": peer.grpc_address,
    }
    if peer.peer_address:
        record["peer-address"] = peer.peer_address
    meta = json.dumps(record, separators=(",", ":")).encode()
    if len(meta) > META_MAX_SIZE:
        raise ValueError(f"node metadata is {len(meta)} bytes, more than memberlist's 512")
    return meta


def decode_meta(meta: bytes | None) -> PeerInfo:
    """A member's metadata as a peer (Gubernator's deprecated gob form is not read)."""
    try:
        record = json.loads(meta or b"")
    except (ValueError, UnicodeDecodeError):
        raise Malformed("metadata is not Gubernator's JSON PeerInfo") from None
    if not isinstance(record, dict):
        raise Malformed("metadata is not a JSON object")
    values = [
        record.get(k, "") for k in ("grpc-address", "http-address", "data-center", "peer-address")
    ]
    if not all(isinstance(v, str) for v in values) or not values[0]:
        raise Malformed("metadata has no grpc-address")
    return PeerInfo(*values)


@dataclass
class PushPull:
    """A push/pull exchange: the join flag, the node states, the user state (unused)."""

    join: bool
    nodes: list[dict[str, Any]] = field(default_factory=list)
    user_state: bytes = b""


def encode_push_pull(state: PushPull) -> bytes:
    """net.go ``sendLocalState``: type, header, each node state, the user state."""
    header = {"Nodes": len(state.nodes), "UserStateLen": len(state.user_state), "Join": state.join}
    parts = [bytes([PUSH_PULL]), encode_struct("push_pull_header", header)]
    parts += [encode_struct("push_node_state", node) for node in state.nodes]
    return b"".join(parts) + state.user_state


def decode_push_pull(body: bytes) -> PushPull:
    """net.go ``readRemoteState`` over a whole body (after the type byte)."""
    unpacker = msgpack.Unpacker(raw=True, strict_map_key=False, max_buffer_size=len(body) + 1)
    unpacker.feed(body)
    try:
        header = decode_struct("push_pull_header", next(unpacker))
        count = header["Nodes"]
        if not 0 <= count <= MAX_PUSH_NODES:
            raise Malformed(f"number of nodes in header ({count}) exceeds limit")
        nodes = [decode_struct("push_node_state", next(unpacker)) for _ in range(count)]
        size = header["UserStateLen"]
        if not 0 <= size <= MAX_STATE_BYTES:
            raise Malformed(f"user state length ({size}) exceeds limit")
        user = bytes(unpacker.read_bytes(size))
    except StopIteration:
        raise Truncated("push/pull state truncated") from None
    except (ValueError, msgpack.FormatError, msgpack.StackError) as exc:
        if isinstance(exc, Malformed):
            raise
        raise Malformed(f"push/pull state: {exc}") from None
    if len(user) != size:
        raise Truncated(f"failed to read full user state ({len(user)} / {size})")
    return PushPull(header["Join"], nodes, user)


def first_object(data: bytes) -> tuple[Any, int]:
    """The first msgpack object of ``data`` and where it ends (a stream's one struct)."""
    unpacker = msgpack.Unpacker(raw=True, strict_map_key=False, max_buffer_size=len(data) + 1)
    unpacker.feed(data)
    try:
        obj = next(unpacker)
    except StopIteration:
        raise Truncated("message truncated") from None
    except (ValueError, msgpack.FormatError, msgpack.StackError) as exc:
        raise Malformed(str(exc)) from None
    return obj, int(unpacker.tell())


def _decrypt_stream(data: bytes, keys: Sequence[bytes]) -> bytes:
    """The plaintext of an encrypted stream (net.go ``decryptRemoteState``)."""
    if not keys:
        raise Malformed("remote state is encrypted and encryption is not configured")
    if len(data) < 5:
        raise Truncated("encrypted stream header")
    size = struct.unpack(">I", data[1:5])[0]
    if size > MAX_STATE_BYTES:
        raise Malformed(f"remote node state is larger than limit ({size})")
    if len(data) < 5 + size:
        raise Truncated("encrypted stream")
    return decrypt(keys, data[5 : 5 + size], data[:5])


def read_stream(data: bytes, keys: Sequence[bytes] = (), verify: bool = True) -> tuple[int, Any]:
    """A stream's message (net.go ``readStream``): ``(PUSH_PULL, PushPull)``, or
    ``(type, struct)`` for a ping, ack or error; encryption (with ``keys``) and
    compression undone; with ``keys`` and ``verify``, a plaintext stream is refused.
    Truncated when ``data`` is not all of it yet."""
    if not data:
        raise Truncated("empty stream")
    kind, body = data[0], data[1:]
    if kind == HAS_LABEL:
        raise Malformed("labelled stream: no GUBER_* setting gives a memberlist label")
    if kind == ENCRYPT:
        plain = _decrypt_stream(data, keys)
        try:
            return read_stream(plain)
        except Truncated as exc:
            raise Malformed(f"encrypted message: {exc}") from None
    if keys and verify:
        raise Malformed("encryption is configured but remote state is not encrypted")
    if kind == COMPRESS:
        obj, _ = first_object(body)
        inner = decompress(decode_struct("compress", obj))
        try:
            return read_stream(inner)
        except Truncated as exc:
            raise Malformed(f"compressed message: {exc}") from None
    if kind == PUSH_PULL:
        return kind, decode_push_pull(body)
    names = {PING: "ping", ACK: "ack", ERR: "err"}
    if kind not in names:
        raise Malformed(f"stream message type {kind} not supported")
    obj, _ = first_object(body)
    return kind, decode_struct(names[kind], obj)
