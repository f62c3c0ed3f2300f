"""A PUSH/PULL pair on 127.0.0.1 for the wire tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import zmq


@contextlib.contextmanager
def push_pull() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """(push, pull), connected; the push queues without bound, so a batch is never
    skipped at its high-water mark."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        yield push, pull
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    with push_pull() as p:
        yield p
