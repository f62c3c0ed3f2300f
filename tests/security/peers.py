"""Real ZeroMQ peers for the security tests: an in-process master on a thread, and
raw gatekeeper and master sockets with or without CURVE keys."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import zmq

from smockron.core.rules import Rule
from smockron.curve import CurveClient, CurveServer
from smockron.master.config import MasterSettings
from smockron.master.domains import DomainPolicy
from smockron.master.server import Master
from smockron.wire.codec import DELAYED, RULES_TOPIC, Control, decode_control, encode_accounting
from tests.master.client import now_ms
from tests.security.conftest import Keys
from tests.support import free_ports


def curve_settings(keys: Keys) -> MasterSettings:
    """A CURVE master on free loopback ports, allowing the keys in ``keys.clients``; one
    rule, for "api"."""
    acc, ctl = (f"tcp://127.0.0.1:{p}" for p in free_ports(2))
    return MasterSettings(
        accounting=acc,
        control=ctl,
        curve_secret=str(keys.secret("master")),
        curve_clients=str(keys.clients),
        domains={"api": DomainPolicy((Rule(1000.0, 5),))},
    )


def forged(ident: bytes, n: int = 20) -> list[list[bytes]]:
    """``n`` DELAYED messages a minute ahead: charged, they would block ``ident`` ~60 s."""
    at = now_ms()
    return [encode_accounting("api", DELAYED, ident, at, at + 60_000) for _ in range(n)]


_LOOPS: weakref.WeakKeyDictionary[Master, asyncio.AbstractEventLoop] = weakref.WeakKeyDictionary()


def on_loop(master: Master, call: Callable[[], object]) -> None:
    """Run ``call`` on the loop of a master from :func:`running_master` (as a signal
    handler runs there), and wait for it."""
    done = threading.Event()

    def run() -> None:
        try:
            call()
        finally:
            done.set()

    _LOOPS[master].call_soon_threadsafe(run)
    assert done.wait(10)


@contextlib.contextmanager
def running_master(settings: MasterSettings) -> Iterator[Master]:
    """``Master.run`` on its own loop and thread, with its own ZeroMQ context."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    master = Master(settings, context=ctx)
    loop = asyncio.new_event_loop()
    _LOOPS[master] = loop
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(master.run())
        except BaseException as exc:  # shown by the test
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while master.monitor is None and not failed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not failed, failed
        yield master
    finally:
        loop.call_soon_threadsafe(master.stop)
        thread.join(10)
        loop.close()
        ctx.term()


class Peer:
    """A gatekeeper's two sockets (PUB accounting, SUB control), optionally CURVE."""

    def __init__(self, accounting: str, control: str, curve: CurveClient | None) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.sub = self.ctx.socket(zmq.SUB)
        for sock in (self.pub, self.sub):
            sock.setsockopt(zmq.LINGER, 0)
            if curve is not None:
                curve.secure(sock)
        self.sub.subscribe(b"")
        self.pub.connect(accounting)
        self.sub.connect(control)

    def send(self, messages: list[list[bytes]]) -> None:
        for frames in messages:
            with contextlib.suppress(zmq.Again):
                self.pub.send_multipart(frames, zmq.NOBLOCK)

    def controls(self, quiet: float) -> list[Control]:
        """DELAY_UNTILs received until none arrives for ``quiet`` seconds."""
        out: list[Control] = []
        while self.sub.poll(int(quiet * 1000)):
            frames = self.sub.recv_multipart()
            if frames[0] != RULES_TOPIC:
                out.append(decode_control(frames))
        return out

    def close(self) -> None:
        self.pub.close()
        self.sub.close()
        self.ctx.term()


class MasterSockets:
    """The two sockets a master binds, nothing behind them: a stand-in for the real
    master (with its keys) or for whatever else takes its ports (without them)."""

    def __init__(self, accounting: str, control: str, curve: CurveServer | None) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.auth = curve.allow_list(self.ctx) if curve is not None else None
        self.sub = self.ctx.socket(zmq.SUB)
        self.pub = self.ctx.socket(zmq.PUB)
        for sock in (self.sub, self.pub):
            sock.setsockopt(zmq.LINGER, 0)
            if curve is not None:
                curve.secure(sock)
        self.sub.subscribe(b"")
        self.sub.bind(accounting)
        self.pub.bind(control)

    def publish(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def close(self) -> None:
        self.sub.close()
        self.pub.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()
