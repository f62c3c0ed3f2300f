"""Real ZeroMQ sockets playing the master's side: SUB bound on accounting, PUB on control."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import zmq

from smockron.wire.codec import RESYNC, Accounting, decode_accounting, encode_control
from tests.support import free_ports


@dataclass
class MasterSockets:
    """The two sockets a master binds, driven by the test."""

    accounting_addr: str
    control_addr: str
    ctx: zmq.Context[zmq.Socket[bytes]] = field(default_factory=zmq.Context)

    def __post_init__(self) -> None:
        self.resyncs: list[bytes] = []
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.bind(self.accounting_addr)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(self.control_addr)

    def accepting(self) -> bool:
        """Let the bound SUB take its new connections (True, for ``wait_for``).

        A bound socket attaches a connection, and sends it its subscription, only when
        its own thread calls into it, as a master draining its socket always does; a
        gatekeeper counts its accounting connection once that subscription arrived."""
        self.sub.getsockopt(zmq.EVENTS)
        return True

    def publish(self, domain: str, identifier: bytes, until_ms: int) -> None:
        self.pub.send_multipart(encode_control(domain, identifier, until_ms))

    def publish_raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def recv_raw(self, timeout_s: float = 5.0) -> list[bytes]:
        """The next accounting message; RESYNC requests (a gatekeeper sends them when
        its control connection comes up) are collected in ``resyncs``, not returned."""
        deadline = time.monotonic() + timeout_s
        while self.sub.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            frames = self.sub.recv_multipart()
            if len(frames) in (2, 3) and frames[1] == RESYNC:
                self.resyncs.append(frames[0])
                continue
            return frames
        raise AssertionError("no accounting message arrived")

    def recv(self, timeout_s: float = 5.0) -> Accounting:
        return decode_accounting(self.recv_raw(timeout_s))

    def drain(self, quiet_s: float = 0.2) -> list[Accounting]:
        out = []
        while self.sub.poll(int(quiet_s * 1000)):
            frames = self.sub.recv_multipart()
            if len(frames) in (2, 3) and frames[1] == RESYNC:
                self.resyncs.append(frames[0])
            else:
                out.append(decode_accounting(frames))
        return out

    def close(self) -> None:
        self.sub.close(0)
        self.pub.close(0)
        self.ctx.term()


def make_master(accounting_port: int, control_port: int) -> MasterSockets:
    return MasterSockets(f"tcp://127.0.0.1:{accounting_port}", f"tcp://127.0.0.1:{control_port}")


@contextlib.contextmanager
def master_sockets() -> Iterator[MasterSockets]:
    """A master's two sockets on free loopback ports, closed at the end."""
    m = make_master(*free_ports(2))
    try:
        yield m
    finally:
        m.close()


@pytest.fixture
def master() -> Iterator[MasterSockets]:
    with master_sockets() as m:
        yield m


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def delayed_by_master(client: httpx.Client, master: MasterSockets) -> None:
    """A DELAY_UNTIL 400 ms ahead for bob: his next request through the gatekeeper
    (``client``'s) waits, then goes."""
    master.publish("api", b"bob", wall_ms() + 400)
    time.sleep(0.1)
    t0 = time.monotonic()
    r = client.get("/", headers={"x-client": "bob"})
    assert r.status_code == 200 and r.headers["x-smockron-decision"] == "delay"
    assert time.monotonic() - t0 >= 0.2
