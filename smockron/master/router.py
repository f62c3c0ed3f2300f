"""``smockron router``: what gatekeepers connect to when there are several masters.

Accounting: gatekeepers publish to the router's SUB; each message goes to the one master
that owns its domain on a consistent-hash ring of the masters' accounting addresses
(so a master's share moves only when masters are added or removed), through one PUB
per master.
Control: one SUB connected to every master's PUB, every message relayed
unchanged to the gatekeepers through the router's PUB. The seed requires exactly this:
"all messages for the same domain go to the same master".

Hostile input: the accounting SUB has the master's frame size limit (ZMQ_MAXMSGSIZE), so
a gatekeeper sending a huge frame loses its own connection to the router rather than
making the router forward it and the master drop the router's connection, which carries
every other gatekeeper's traffic. A message without a domain, or with more frames than
any valid message has (the router would forward only the first ones), is discarded,
counted and logged (rate-limited) with its real length; other malformed messages go to
the domain's master, which counts and logs them by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
from prometheus_client import CollectorRegistry
from zmq.utils.monitor import parse_monitor_message

from smockron.core.hashring import HashRing
from smockron.curve import (
    HANDSHAKE_FAILED,
    REDIAL_S,
    AllowList,
    CurveClient,
    CurveServer,
    allow_ipv6,
    bind_mode,
)
from smockron.errors import ConfigError
from smockron.master.server import MAX_FRAME_BYTES
from smockron.observe import CountersCollector, ObserveServer, Readiness, serve
from smockron.observe.layouts import ROUTER
from smockron.ratelog import RateLimitedLog
from smockron.wire.batchio import drain, send_all, wait_readable
from smockron.wire.codec import MAX_FRAMES, frame_count

log = logging.getLogger("smockron.router")

OWNER_CACHE = 65_536
"""Domains whose owner is memoised; a flood of random domains only resets the cache."""


@dataclass(frozen=True, slots=True)
class MasterAddress:
    accounting: str
    control: str

    @classmethod
    def parse(cls, spec: str) -> MasterAddress:
        """``ACC_ADDR,CTL_ADDR``, e.g. ``tcp://10.0.0.5:10004,tcp://10.0.0.5:10005``."""
        acc, sep, ctl = spec.partition(",")
        if not sep or not acc.strip() or not ctl.strip():
            raise ConfigError(f"cannot parse master {spec!r}: expected ACC_ADDR,CTL_ADDR")
        return cls(acc.strip(), ctl.strip())


class Router:
    def __init__(
        self,
        accounting: str,
        control: str,
        masters: Sequence[MasterAddress],
        *,
        hwm: int = 100_000,
        batch: int = 2_000,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        curve_server: CurveServer | None = None,
        curve_client: CurveClient | None = None,
        insecure_bind: bool = False,
        metrics: str | None = None,
    ) -> None:
        if not masters:
            raise ConfigError("the router needs at least one --master")
        names = [m.accounting for m in masters]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate master accounting address in {names}")
        self.accounting = accounting
        self.control = control
        self.masters = list(masters)
        self.ring = HashRing(names)
        self.batch = batch
        self.hwm = hwm
        self.ctx = context or zmq.Context.instance()
        self.frontend = self.ctx.socket(zmq.SUB)
        self.control_in = self.ctx.socket(zmq.SUB)
        self.control_out = self.ctx.socket(zmq.PUB)
        self.to_master: dict[str, zmq.Socket[bytes]] = {}
        self._owners: dict[bytes, zmq.Socket[bytes]] = {}
        self.forwarded = 0
        self.relayed = 0
        self.discarded = 0
        self.discard_log = RateLimitedLog(log, burst=10)
        self.curve_server = curve_server  # towards the gatekeepers
        self.curve_client = curve_client  # towards the masters
        self.insecure_bind = insecure_bind
        self.auth: AllowList | None = None
        self._watched: list[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]] = []  # (sock, monitor)
        self.handshake_log = RateLimitedLog(log, interval=60.0)
        self._stopping = asyncio.Event()
        self.metrics = metrics
        self.listener: ObserveServer | None = None
        self.bound = False

    def secure(self) -> None:
        """As the master's: protected mode, then CURVE on both sides, before binding."""
        allowed = None
        if self.curve_server is not None:
            self.auth = self.curve_server.allow_list(self.ctx)
            allowed = len(self.auth.keys)
            for sock in (self.frontend, self.control_out):
                self.curve_server.secure(sock)
        if self.curve_client is not None:
            self._watch(self.control_in)
        level, line = bind_mode((self.accounting, self.control), allowed, self.insecure_bind)
        log.log(level, line)

    def bind(self) -> None:
        self.secure()
        for sock in (self.frontend, self.control_in, self.control_out):
            sock.setsockopt(zmq.LINGER, 200)
        for sock in (self.frontend, self.control_in):
            sock.setsockopt(zmq.RCVHWM, self.hwm)
            sock.subscribe(b"")
        self.frontend.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.control_out.setsockopt(zmq.SNDHWM, self.hwm)
        allow_ipv6(self.frontend, self.accounting)
        allow_ipv6(self.control_out, self.control)
        allow_ipv6(self.control_in, *(m.control for m in self.masters))
        self.frontend.bind(self.accounting)
        self.control_out.bind(self.control)
        for m in self.masters:
            pub = self.ctx.socket(zmq.PUB)
            allow_ipv6(pub, m.accounting)
            pub.setsockopt(zmq.SNDHWM, self.hwm)
            pub.setsockopt(zmq.LINGER, 200)
            if self.curve_client is not None:
                self._watch(pub)
            pub.connect(m.accounting)
            self.to_master[m.accounting] = pub
            self.control_in.connect(m.control)
        self.bound = True
        log.info(
            "router: accounting on %s, control on %s, %d master(s): %s",
            self.accounting,
            self.control,
            len(self.masters),
            ", ".join(f"{m.accounting}|{m.control}" for m in self.masters),
        )

    def _watch(self, sock: zmq.Socket[bytes]) -> None:
        """CURVE towards the masters, and a monitor of failed handshakes (see _redial)."""
        assert self.curve_client is not None
        self.curve_client.secure(sock)
        self._watched.append((sock, sock.get_monitor_socket(HANDSHAKE_FAILED)))

    async def _redial(self) -> None:
        """Dial a master again ``REDIAL_S`` after a failed handshake (libzmq gives up)."""
        due: dict[tuple[int, str], float] = {}
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for i, (_sock, monitor) in enumerate(self._watched):
                while monitor.poll(0):
                    endpoint = parse_monitor_message(monitor.recv_multipart())["endpoint"]
                    address = endpoint.decode("utf-8", "replace")
                    self.handshake_log.warning("handshake with master %s failed: does it "
                                               "hold --curve-server's key, and allow this "
                                               "router's key?", address, key=address)  # fmt: skip
                    due.setdefault((i, address), now + REDIAL_S)
            for (i, address), when in list(due.items()):
                if when <= now:
                    del due[(i, address)]
                    sock = self._watched[i][0]
                    with contextlib.suppress(zmq.ZMQError):
                        sock.disconnect(address)
                    with contextlib.suppress(zmq.ZMQError):
                        sock.connect(address)

    def reload(self) -> None:
        """SIGHUP: read the allowed gatekeeper keys again (the masters and addresses need a
        restart)."""
        if self.auth is None:
            log.info("router: SIGHUP: no --curve-clients to reread (restart to apply changes)")
            return
        log.info("control plane: CURVE, %d allowed gatekeeper key(s)",
                 self.auth.reload(self.frontend, self.control_out))  # fmt: skip

    def stats(self) -> dict[str, int]:
        denied = self.auth.denied if self.auth is not None else 0
        return {
            "forwarded": self.forwarded,
            "relayed": self.relayed,
            "discarded": self.discarded,
            "denied": denied,
        }

    def observe(self, address: str) -> ObserveServer:
        """/metrics (forwarded, relayed, discarded), /healthz, /readyz (both sides bound)."""
        registry = CollectorRegistry()
        registry.register(CountersCollector(ROUTER, self.stats))
        readiness = Readiness({"bound": lambda: None if self.bound else "sockets not bound yet"})
        return serve(address, readiness, registry)

    def owner(self, domain_frame: bytes) -> zmq.Socket[bytes]:
        """The PUB towards the master owning a domain (its frame, NUL included)."""
        sock = self._owners.get(domain_frame)
        if sock is None:
            if len(self._owners) >= OWNER_CACHE:
                self._owners.clear()
            domain = domain_frame[:-1] if domain_frame.endswith(b"\0") else domain_frame
            owner = self.ring.owner(domain)
            sock = self._owners[domain_frame] = self.to_master[owner]
        return sock

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serve until ``stop``; with ``handle_signals`` SIGTERM/SIGINT call it (the
        ``smockron`` command leaves signals to smockron.runtime instead)."""
        loop = asyncio.get_running_loop()
        try:
            self.bind()
            if self.metrics:
                self.listener = self.observe(self.metrics)
        except BaseException:
            self.close()
            raise
        for sig in (signal.SIGTERM, signal.SIGINT):
            if handle_signals:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self.stop)
        tasks = [asyncio.create_task(self._accounting()), asyncio.create_task(self._control())]
        if self._watched:
            tasks.append(asyncio.create_task(self._redial()))
        try:
            await self._stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for sig in (signal.SIGTERM, signal.SIGINT) if handle_signals else ():
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)
            self.close()
            log.info(
                "router stopped: forwarded %d, relayed %d, discarded %d, denied %d",
                self.forwarded,
                self.relayed,
                self.discarded,
                self.auth.denied if self.auth is not None else 0,
            )

    def close(self) -> None:
        for sock, monitor in self._watched:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(0)
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for sock in (self.frontend, self.control_in, self.control_out, *self.to_master.values()):
            sock.close()
        if self.auth is not None:
            self.auth.stop()

    async def _accounting(self) -> None:
        while True:
            batch = drain(self.frontend, self.batch)
            if not batch:
                await wait_readable(self.frontend, 0.25)
                continue
            by_owner: dict[zmq.Socket[bytes], list[list[bytes]]] = {}
            for frames in batch:
                if not frames[0] or frame_count(frames) > MAX_FRAMES:
                    self._discard(frames)
                    continue
                sock = self.owner(frames[0])
                group = by_owner.get(sock)
                if group is None:
                    group = by_owner[sock] = []
                group.append(frames)
            for sock, group in by_owner.items():
                self.forwarded += send_all(sock, group)
            await asyncio.sleep(0)

    def _discard(self, frames: Sequence[bytes]) -> None:
        """Count and log a message no master could use (``%r`` escapes its bytes)."""
        self.discarded += 1
        count = frame_count(frames)
        why = "without a domain" if not frames[0] else f"over {MAX_FRAMES} frames"
        self.discard_log.warning(
            "discarded accounting message %s (%d frames): %r",
            why,
            count,
            [f[:40] for f in frames[:3]],
            key=why,
        )

    async def _control(self) -> None:
        while True:
            batch = drain(self.control_in, self.batch)
            if not batch:
                await wait_readable(self.control_in, 0.25)
                continue
            self.relayed += send_all(self.control_out, batch)
            await asyncio.sleep(0)
