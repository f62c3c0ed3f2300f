"""Draining a ZeroMQ socket in batches, and sending batches: the master's costliest part,
and the gatekeepers' accounting.

``recv_multipart`` asks libzmq "more frames?" through ``getsockopt(RCVMORE)`` after
every frame, which costs more than receiving the frame. This module reads each frame
with ``recv(copy=False)`` and its ``.more`` attribute instead, and takes whole batches
without blocking (``NOBLOCK``) so the caller processes them in one go. A compiled
version (``smockron.wire._zmqfast``, hand-written C in ``_zmqfast.c``, built by
``setup.py`` as an optional extension when a compiler is available) calls libzmq
directly; this pure-Python loop is the fallback and behaves the same. The accounting
decode done while receiving is in :mod:`smockron.wire.accounting`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, cast

import zmq

from smockron import compiled
from smockron.wire.codec import MAX_FRAMES, Oversized

__all__ = [
    "MAX_FRAMES",
    "Drain",
    "SendAll",
    "drain",
    "drain_compiled",
    "drain_python",
    "send_all",
    "send_all_compiled",
    "send_all_python",
    "send_until_refused",
    "wait_readable",
]

Drain = Callable[[zmq.Socket[bytes], int], list[list[bytes]]]


class SendAll(Protocol):
    """``send_all``'s signature (either twin)."""

    def __call__(
        self, sock: zmq.Socket[bytes], messages: list[list[bytes]], stop: bool = False
    ) -> int: ...


DrainDecodedC = Callable[..., tuple[list[Any], list[list[bytes]]]]
SendControlsC = Callable[[zmq.Socket[bytes], bytes, bytes, list[tuple[bytes, int]], bool], int]


def drain_python(sock: zmq.Socket[bytes], limit: int) -> list[list[bytes]]:
    """Up to ``limit`` whole messages that are already queued; never blocks. Of a message
    longer than ``MAX_FRAMES`` frames, an :class:`~smockron.wire.codec.Oversized` of its
    first frames: the rest are read and counted, not kept."""
    out: list[list[bytes]] = []
    recv = sock.recv
    noblock = zmq.NOBLOCK
    try:
        while len(out) < limit:
            frame = recv(noblock, copy=False)
            msg = [frame.bytes]
            total = 1
            while frame.more:  # the rest of a multipart message has arrived with it
                frame = recv(0, copy=False)
                total += 1
                if total <= MAX_FRAMES:
                    msg.append(frame.bytes)
            out.append(msg if total == len(msg) else Oversized(msg, total))
    except zmq.Again:
        pass
    return out


def send_all_python(
    sock: zmq.Socket[bytes], messages: list[list[bytes]], stop: bool = False
) -> int:
    """Send whole messages without blocking; one the socket cannot take is skipped (or,
    with ``stop``, ends the call: the first ``sent`` went, the rest did not). Another
    error is raised with ``sent``: how many messages went out before it."""
    send = sock.send_multipart
    sent = 0
    for frames in messages:
        try:
            send(frames, zmq.NOBLOCK)
        except zmq.Again:  # a PUB drops at its high-water mark anyway
            if stop:
                break
            continue
        except zmq.ZMQError as exc:
            exc.sent = sent  # type: ignore[attr-defined]
            raise
        sent += 1
    return sent


def _loaded_libzmq() -> str | None:
    """The path of the libzmq that pyzmq loaded (Linux: from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                name = path.rpartition("/")[2]
                if name.startswith("libzmq") and ".so" in name:
                    return "/" + path
    except OSError:
        pass
    return None


class _Compiled(NamedTuple):
    drain: Drain
    send_all: SendAll
    drain_accounting: DrainDecodedC
    drain_control: Callable[..., list[Any]]
    send_controls: SendControlsC


def _load_compiled() -> _Compiled | None:
    """The C loop bound to pyzmq's own libzmq, or None (then the Python loop is used).
    ``SMOCKRON_PURE_PYTHON=1`` forces the Python loop (tests run both); so does a
    compiled module built for another ``MAX_FRAMES`` (a stale build)."""
    _zmqfast = compiled.load("_zmqfast")
    if _zmqfast is None:
        return None
    path = _loaded_libzmq()
    if path is None or getattr(_zmqfast, "MAX_FRAMES", None) != MAX_FRAMES:
        compiled.mark_unusable("_zmqfast")
        return None
    try:
        _zmqfast.bind(path, zmq.ZMQError, Oversized)
    except ImportError:
        compiled.mark_unusable("_zmqfast")
        return None
    return _Compiled(
        _zmqfast.drain,
        _zmqfast.send_all,
        _zmqfast.drain_accounting,
        _zmqfast.drain_control,
        _zmqfast.send_controls,
    )


_compiled = _load_compiled()
drain_compiled: Drain | None = _compiled.drain if _compiled else None
send_all_compiled: SendAll | None = _compiled.send_all if _compiled else None
drain: Drain = drain_compiled or drain_python
send_all: SendAll = send_all_compiled or send_all_python


def send_until_refused(sock: zmq.Socket[bytes], messages: list[list[bytes]]) -> int:
    """Send messages in order until the socket refuses one (a PUB with ``XPUB_NODROP``
    whose slowest subscriber is full); how many went. Never blocks."""
    return send_all(sock, messages, True)


drain_accounting_c: DrainDecodedC | None = _compiled.drain_accounting if _compiled else None
"""The raw C entry point behind :func:`smockron.wire.accounting.drain_accounting`."""
drain_control_c: Callable[..., list[Any]] | None = _compiled.drain_control if _compiled else None
"""...and behind :func:`smockron.wire.control.drain_control`..."""
send_controls_c: SendControlsC | None = _compiled.send_controls if _compiled else None
"""...and :func:`smockron.wire.control.send_controls`."""


async def wait_readable(sock: zmq.Socket[bytes], timeout: float) -> None:
    """Wait until ``sock`` may have a message (or ``timeout``), once: a :class:`Readable`
    for one wait. A loop that waits after every drain keeps its own :class:`Readable`."""
    readable = Readable(sock, asyncio.get_running_loop())
    try:
        await readable.wait(timeout)
    finally:
        readable.close()


class Readable:
    """Waits for a socket's messages on its FD, watched from construction to
    :meth:`close`: a loop that waits after every drain (the master's receive loop:
    hundreds of times a second under a trickle of accounting) looks the FD up once and
    adds no reader per wait (two ``epoll_ctl`` calls each).

    ZeroMQ's FD is edge-triggered: ZMQ_EVENTS is asked after the FD is watched, so a
    message that came before is not missed. The timeout is a timer on the same future,
    not ``asyncio.wait_for``: on Python 3.11 that returns the result instead of raising
    when a cancellation comes together with the readiness (a loop that had not run for
    a while), and the reader task never ended.

    The loop watches the FD between waits too: while it is ready and the owner has not
    drained yet, each turn of the loop makes a call that finds no waiter (libzmq
    clears the FD whenever the socket is read or its ZMQ_EVENTS asked, and the owner
    drains before each wait). :meth:`close` before the socket."""

    def __init__(self, sock: zmq.Socket[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.sock = sock
        self.loop = loop
        self.fd = cast(int, sock.getsockopt(zmq.FD))
        self.waiter: asyncio.Future[None] | None = None
        loop.add_reader(self.fd, self._wake)

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until the socket may have a message, or ``timeout``. The FD also signals
        libzmq's own commands (a connection attached, say), so it may return with none:
        the caller drains, finds nothing and waits again, as after a timeout."""
        if _has_message(self.sock):  # (also clears the FD: a signal after it wakes us)
            return
        waiter = self.waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, self._wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def close(self) -> None:
        self.loop.remove_reader(self.fd)


def _has_message(sock: zmq.Socket[bytes]) -> bool:
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)
