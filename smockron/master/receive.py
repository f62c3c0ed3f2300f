"""Draining a ZeroMQ socket in batches, the part of the master that dominates its cost.

``recv_multipart`` asks libzmq "more frames?" through ``getsockopt(RCVMORE)`` after
every frame, which costs more than receiving the frame. This module reads each frame
with ``recv(copy=False)`` and its ``.more`` attribute instead, and takes whole batches
without blocking (``NOBLOCK``) so the caller processes them in one go. A compiled
version (``smockron.master._fastrecv``, built from ``_fastrecv.pyx`` when Cython and a
compiler are available) calls libzmq directly; this pure-Python loop is the fallback and
behaves the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import cast

import zmq

MAX_FRAMES = 16
"""Frames beyond this are read and discarded (the message is malformed anyway)."""

Drain = Callable[[zmq.Socket[bytes], int], list[list[bytes]]]


def drain_python(sock: zmq.Socket[bytes], limit: int) -> list[list[bytes]]:
    """Up to ``limit`` whole messages that are already queued; never blocks."""
    out: list[list[bytes]] = []
    recv = sock.recv
    noblock = zmq.NOBLOCK
    try:
        while len(out) < limit:
            frame = recv(noblock, copy=False)
            msg = [frame.bytes]
            while frame.more:  # the rest of a multipart message has arrived with it
                frame = recv(0, copy=False)
                if len(msg) < MAX_FRAMES:
                    msg.append(frame.bytes)
            out.append(msg)
    except zmq.Again:
        pass
    return out


def _load_compiled() -> Drain | None:
    try:
        from smockron.master import _fastrecv  # type: ignore[attr-defined]
    except ImportError:
        return None
    drain: Drain = _fastrecv.drain
    return drain


drain_compiled = _load_compiled()
drain: Drain = drain_compiled or drain_python


async def wait_readable(sock: zmq.Socket[bytes], timeout: float) -> None:
    """Wait until ``sock`` has a message (or ``timeout``). ZeroMQ's FD is edge-triggered,
    so ZMQ_EVENTS is checked after registering the reader, not only before."""
    if _has_message(sock):
        return
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = cast(int, sock.getsockopt(zmq.FD))

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        if _has_message(sock):
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready, timeout)
    finally:
        loop.remove_reader(fd)


def _has_message(sock: zmq.Socket[bytes]) -> bool:
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)
