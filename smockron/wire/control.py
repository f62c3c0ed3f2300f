"""Control messages in bulk: DELAY_UNTILs decoded while received (the gatekeepers), and
encoded while sent (the master's RESYNC answers). One contract, two twins each.

Receiving, like :mod:`smockron.wire.accounting` but in one list, in the order received
(a gatekeeper's loss count compares what it received with the master's heartbeats):
*records*, the DELAY_UNTILs plainly valid for a subscribed topic, as tuples
``(domain, identifier, until ms)``; and *raw* messages (lists), everything else (rules
offers, publish counters, resync marks, malformed messages), for the codec to decode or
to name the problem. :func:`split_control` is the pure-Python twin of the compiled
``drain_control`` of ``_zmqfast.c``.

Sending: :func:`send_controls` publishes one DELAY_UNTIL per ``(identifier, until ms)``
pair, the frames of :func:`smockron.wire.codec.control_frames`; the compiled twin
encodes them in C, without a Python list or timestamp object per message, which is what
lets a resync of a million verdicts go out in well under a second.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeAlias, TypeVar, cast

import zmq

from smockron.wire.batchio import drain_control_c, drain_python, send_all_python, send_controls_c
from smockron.wire.codec import DELAY_UNTIL, Limits, control_frames

D = TypeVar("D")
ControlRecord: TypeAlias = tuple[D, bytes, int]
Raw: TypeAlias = Sequence[bytes]
ControlBatch: TypeAlias = list[ControlRecord[D] | Raw]
"""Records and raw messages, in the order received."""
DrainControl: TypeAlias = Callable[
    [zmq.Socket[bytes], int, dict[bytes, D], Limits], ControlBatch[D]
]


class SendControls(Protocol):
    """``send_controls``' signature (either twin)."""

    def __call__(
        self,
        sock: zmq.Socket[bytes],
        topic_frame: bytes,
        pairs: list[tuple[bytes, int]],
        stop: bool = False,
    ) -> int: ...


COMPILED = drain_control_c is not None and send_controls_c is not None
"""Whether the compiled twins loaded (``SMOCKRON_PURE_PYTHON=1`` keeps them unloaded)."""


def split_control(batch: Iterable[Raw], topics: dict[bytes, D], limits: Limits) -> ControlBatch[D]:
    """Records for the DELAY_UNTILs plainly valid for a known topic, the rest raw, in order."""
    max_id = limits.max_identifier
    max_digits = limits.max_timestamp_digits
    max_ts = limits.max_timestamp_ms
    out: ControlBatch[D] = []
    add = out.append
    get = topics.get
    delay_until = DELAY_UNTIL
    for frames in batch:
        if len(frames) == 4 and frames[1] == delay_until:
            until_f = frames[3]
            if until_f.isdigit() and len(until_f) <= max_digits and len(frames[2]) <= max_id:
                until = int(until_f)
                dom = get(frames[0])
                if dom is not None and until <= max_ts:
                    add((dom, frames[2], until))
                    continue
        add(frames)
    return out


def drain_control_python(
    sock: zmq.Socket[bytes], limit: int, topics: dict[bytes, D], limits: Limits
) -> ControlBatch[D]:
    """Up to ``limit`` queued messages, split as :func:`split_control` does."""
    return split_control(drain_python(sock, limit), topics, limits)


def drain_control_compiled(
    sock: zmq.Socket[bytes], limit: int, topics: dict[bytes, D], limits: Limits
) -> ControlBatch[D]:
    """The compiled twin of :func:`drain_control_python`; only when ``COMPILED``."""
    if drain_control_c is None:
        raise RuntimeError("smockron.wire._zmqfast is not loaded")
    bounds = (limits.max_identifier, limits.max_timestamp_digits, limits.max_timestamp_ms)
    return cast(ControlBatch[D], drain_control_c(sock, limit, topics, DELAY_UNTIL, bounds))


def send_controls_python(
    sock: zmq.Socket[bytes], topic_frame: bytes, pairs: list[tuple[bytes, int]], stop: bool = False
) -> int:
    """One DELAY_UNTIL per ``(identifier, until ms)`` on ``topic_frame``; never blocks.
    How many were sent: a message the socket cannot take is skipped, or, with ``stop``,
    ends the call (the first ones went, the rest did not: a paced sender tries again)."""
    messages = [control_frames(topic_frame, i, u) for i, u in pairs]
    return send_all_python(sock, messages, stop)


def send_controls_compiled(
    sock: zmq.Socket[bytes], topic_frame: bytes, pairs: list[tuple[bytes, int]], stop: bool = False
) -> int:
    """The compiled twin of :func:`send_controls_python`; only when ``COMPILED``."""
    if send_controls_c is None:
        raise RuntimeError("smockron.wire._zmqfast is not loaded")
    return send_controls_c(sock, topic_frame, DELAY_UNTIL, pairs, stop)


drain_control: DrainControl[bytes] = drain_control_compiled if COMPILED else drain_control_python
"""Up to ``limit`` queued control messages, DELAY_UNTILs decoded while received."""

send_controls: SendControls = send_controls_compiled if COMPILED else send_controls_python
"""One DELAY_UNTIL per pair, encoded while sent."""
