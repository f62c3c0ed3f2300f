"""smockron's fleet messages: private RESYNC answers and a master's warm start.

Neither reaches an original program: every topic here starts with a NUL, and no
``domain\\0`` subscription (a domain is never empty) is a prefix of it; nor do they
reach smockron gatekeepers' ``\\0smockron\\0`` subscription (the tenth byte differs).

A RESYNC with a third frame asks for a private answer::

    gatekeeper -> master (accounting)   domain\\0 | RESYNC | REPLY
    master -> that gatekeeper (control) REPLY | RESYNCSTART
                                        REPLY | DELAY_UNTIL | identifier | until ms   (each)
                                        REPLY | RESYNCDONE

``REPLY`` is ``\\0smockron-resync\\0`` plus a token the gatekeeper chose and subscribed to,
so only it receives the answer. A bare two-frame RESYNC (the original's ``resync``
branch) is answered on the domain's topic as before.

A master that (re)starts takes its peers' states before it can be trusted alone::

    new master -> peer (accounting)     \\0smockron-sync\\0TOKEN | SYNC | shard bitmap
    peer -> new master (control)        \\0smockron-sync\\0TOKEN | SYNCSTART
                                        \\0smockron-sync\\0TOKEN | STATES | scope | id | state | ...
                                        \\0smockron-sync\\0TOKEN | SYNCDONE | count

``scope`` is the store's scope prefix (algorithm, domain, rate and burst: a rule that
differs between the two masters is not taken), a state is its floats as little-endian
IEEE doubles.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Final

from smockron.errors import ProtocolError
from smockron.wire.codec import RESYNC

RESYNC_REPLY_PREFIX: Final = b"\0smockron-resync\0"
SYNC_PREFIX: Final = b"\0smockron-sync\0"
FLEET_PREFIX: Final = b"\0smockron"
"""What a fleet master subscribes to besides its domains and shards: sync requests
(and ``\\0smockron\\0`` messages, which it ignores)."""
MAX_TOKEN: Final = 64
SYNC: Final = b"SYNC"
SYNCSTART: Final = b"SYNCSTART"
STATES: Final = b"STATES"
SYNCDONE: Final = b"SYNCDONE"
STATES_PER_MESSAGE: Final = 512
MAX_STATE_FLOATS: Final = 100_000
"""A history holds at most its burst's timestamps (bursts have at most nine digits, but a
state this long is a forged one)."""


def valid_reply(frame: bytes, prefix: bytes = RESYNC_REPLY_PREFIX) -> bool:
    """Whether ``frame`` is a private answer topic a master may publish on."""
    return frame.startswith(prefix) and len(prefix) < len(frame) <= len(prefix) + MAX_TOKEN


def resync_reply(token: bytes) -> bytes:
    return RESYNC_REPLY_PREFIX + token


def encode_private_resync(domain_topic: bytes, reply: bytes) -> list[bytes]:
    return [domain_topic, RESYNC, reply]


def sync_topic(token: bytes) -> bytes:
    return SYNC_PREFIX + token


def encode_sync(token: bytes, shard_bitmap: bytes) -> list[bytes]:
    return [sync_topic(token), SYNC, shard_bitmap]


def encode_state(state: Sequence[float]) -> bytes:
    return struct.pack(f"<{len(state)}d", *state)


def decode_state(frame: bytes) -> tuple[float, ...]:
    if not frame or len(frame) % 8 or len(frame) // 8 > MAX_STATE_FLOATS:
        raise ProtocolError(
            "bad_state", f"a state is 1 to {MAX_STATE_FLOATS} doubles, got {len(frame)} bytes"
        )
    return struct.unpack(f"<{len(frame) // 8}d", frame)


def encode_states(
    reply: bytes, scope: bytes, pairs: Sequence[tuple[bytes, Sequence[float]]]
) -> Iterator[list[bytes]]:
    """``STATES`` messages of at most ``STATES_PER_MESSAGE`` states each."""
    for at in range(0, len(pairs), STATES_PER_MESSAGE):
        frames = [reply, STATES, scope]
        for ident, state in pairs[at : at + STATES_PER_MESSAGE]:
            frames += (ident, encode_state(state))
        yield frames


def decode_states(frames: Sequence[bytes]) -> tuple[bytes, list[tuple[bytes, tuple[float, ...]]]]:
    """A ``STATES`` message: its scope and ``(identifier, state)`` pairs."""
    if len(frames) < 3 or frames[1] != STATES or len(frames) % 2 == 0:
        raise ProtocolError(
            "frame_count", f"a STATES message has a scope and pairs, got {len(frames)} frames"
        )
    if len(frames) > 3 + 2 * STATES_PER_MESSAGE:
        raise ProtocolError("frame_count", f"more than {STATES_PER_MESSAGE} states in one message")
    pairs = [(frames[i], decode_state(frames[i + 1])) for i in range(3, len(frames), 2)]
    return frames[2], pairs
