"""The DThrottle daemon: line-protocol listeners, the report schedule, the peers.

All decisions are made by :class:`~smockron.daemons.dthrottle.algorithm.Throttle`; this module only
moves bytes. Queries arriving in one read are answered with one write, which is what
makes pipelining fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import stat
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, cast

from prometheus_client import CollectorRegistry

from smockron.counters import CounterSet
from smockron.daemons.dthrottle.algorithm import Throttle
from smockron.daemons.dthrottle.clock import Clock, MonotonicClock
from smockron.daemons.dthrottle.config import DThrottleConfig, Listen
from smockron.daemons.dthrottle.peers import MulticastPeers, PeerTransport, UnicastPeers
from smockron.daemons.dthrottle.report import PeerLedger, decode_report, encode_report
from smockron.errors import ConfigError, ProtocolError
from smockron.memory import Reclaimer
from smockron.observe import CountersCollector, ObserveServer, Readiness, serve
from smockron.observe.layouts import DTHROTTLE
from smockron.ratelog import RateLimitedLog
from smockron.runtime import log_stats

log = logging.getLogger("smockron.dthrottle")
_ratelog = RateLimitedLog(log)


SOCKET_MODE = 0o660
"""Permissions of a Unix listening socket: its owner and group may connect."""


@dataclass(slots=True)
class DThrottleStats(CounterSet):
    """Counters since start; logged periodically and read by tests."""

    connections: int = 0
    open_connections: int = 0
    queries: int = 0
    refused: int = 0
    overlong: int = 0
    reports_sent: int = 0
    datagrams_sent: int = 0
    datagrams_received: int = 0
    parts_applied: int = 0
    own_echoes: int = 0
    duplicates: int = 0
    garbage: Counter[str] = field(default_factory=Counter)
    """Peer report datagrams dropped as malformed, by ``ProtocolError.reason``."""


class LineProtocol(asyncio.Protocol):
    """One client connection: ``TAG\\n`` in, ``OK\\n`` or ``NO\\n`` out, pipelined."""

    __slots__ = ("_buf", "_closing", "_daemon", "_limit", "_transport")

    def __init__(self, daemon: DThrottleDaemon) -> None:
        self._daemon = daemon
        self._limit = daemon.config.max_tag_length
        self._buf = b""
        self._closing = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        stats = self._daemon.stats
        stats.connections += 1
        stats.open_connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._daemon.stats.open_connections -= 1
        self._transport = None

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if self._closing or transport is None:
            return
        if self._buf:
            data = self._buf + data
        lines = data.split(b"\n")
        rest = lines.pop()
        limit = self._limit
        if lines:
            if max(map(len, lines)) > limit:
                good = next(i for i, line in enumerate(lines) if len(line) > limit)
                if good:
                    transport.write(self._daemon.answer(lines[:good]))
                self._overlong(transport)
                return
            transport.write(self._daemon.answer(lines))
        if len(rest) > limit:
            self._overlong(transport)
            return
        self._buf = rest

    def _overlong(self, transport: asyncio.Transport) -> None:
        """A line past the tag limit: answer what came before it, then close this one only."""
        self._closing = True
        self._buf = b""
        self._daemon.stats.overlong += 1
        _ratelog.warning(
            "closing connection from %s: line longer than the %d-byte tag limit",
            transport.get_extra_info("peername") or "unix socket",
            self._limit,
        )
        transport.close()

    def pause_writing(self) -> None:
        """A client that pipelines without reading: stop reading until it catches up."""
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()


class DThrottleDaemon:
    """Owns the throttle, the listeners, the peer transports and the report schedule."""

    def __init__(
        self,
        config: DThrottleConfig,
        *,
        clock: Clock | None = None,
        sender_id: int | None = None,
        stats_every: float | None = 60.0,
        metrics: str | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or MonotonicClock()
        self.sender_id = sender_id if sender_id is not None else secrets.randbits(64)
        self.throttle = Throttle(config.rule_table(), config.max_entries)
        self._evicted_logged = 0
        self.reclaimer = Reclaimer()
        self.stats = DThrottleStats()
        self.ledger = PeerLedger()
        self.transports: list[PeerTransport] = []
        self.servers: list[asyncio.Server] = []
        self.addresses: list[str] = []
        self._seq = 0
        self._stats_every = stats_every
        self._tasks: list[asyncio.Task[None]] = []
        self._unix_paths: list[str] = []
        self.metrics = metrics
        self.listener: ObserveServer | None = None
        self.started = False

    def counters(self) -> dict[str, int]:
        """For /metrics: the stats with tags answered OK (accepted) and NO (refused),
        malformed datagrams (``garbage``) and the gauges."""
        out = self.stats.as_dict()
        out["accepted"] = out.pop("queries") - out["refused"]
        out["malformed"] = out.pop("garbage")
        out["buckets"] = len(self.throttle.buckets)
        out["peers"] = self.ledger.peers
        out["evicted"] = self.throttle.evicted
        return out

    def observe(self, address: str) -> ObserveServer:
        """/metrics, /healthz, /readyz (every listener and peer transport is up)."""
        registry = CollectorRegistry()
        registry.register(CountersCollector(DTHROTTLE, self.counters))
        ready = Readiness({"listening": lambda: None if self.started else "not listening yet"})
        return serve(address, ready, registry)

    # -- queries ---------------------------------------------------------------------
    def answer(self, tags: list[bytes]) -> bytes:
        out = self.throttle.answer(tags, self.clock.now())
        stats = self.stats
        stats.queries += len(tags)
        stats.refused += out.count(b"N")
        return out

    def reconfigure(self, config: DThrottleConfig) -> None:
        """SIGHUP: new rules, rate, burst and whitelist at once; listeners and peers need
        a restart."""
        fixed = (
            "listen",
            "peers",
            "peer_bind",
            "multicast",
            "multicast_interface",
            "multicast_ttl",
            "max_datagram",
            "max_tag_length",
        )
        changed = [name for name in fixed if getattr(config, name) != getattr(self.config, name)]
        if changed:
            log.warning("reload: %s changed; they need a restart, ignored", ", ".join(changed))
        self.throttle.reconfigure(config.rule_table())
        self.throttle.max_entries = config.max_entries
        self.config = replace(
            self.config,
            burst=config.burst,
            rate=config.rate,
            rules=config.rules,
            whitelist=config.whitelist,
            report_interval=config.report_interval,
            max_entries=config.max_entries,
        )
        log.info(
            "reloaded: burst %d, rate %g/s, %d rules, %d whitelisted",
            config.burst,
            config.rate,
            len(config.rules),
            len(config.whitelist),
        )

    # -- reports ---------------------------------------------------------------------
    def report_now(self) -> int:
        """Publish the hits since the last report; returns the datagrams sent."""
        buckets = len(self.throttle.buckets)
        hits = self.throttle.take_report(self.clock.now())
        self._reclaim(buckets - len(self.throttle.buckets))
        self._log_evictions()
        if not hits or not self.transports:
            return 0
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        datagrams = encode_report(self.sender_id, self._seq, hits, self.config.max_datagram)
        for transport in self.transports:
            transport.send(datagrams)
        self.stats.reports_sent += 1
        self.stats.datagrams_sent += len(datagrams)
        log.debug("sent report %d: %d tags in %d datagrams", self._seq, len(hits), len(datagrams))
        return len(datagrams)

    def _log_evictions(self) -> None:
        """One line (rate-limited) when buckets were evicted at ``max_entries`` since the
        last report: many new tags with a slow refill, from a scan or spoofed tags."""
        evicted = self.throttle.evicted - self._evicted_logged
        if evicted:
            self._evicted_logged = self.throttle.evicted
            _ratelog.warning(
                "bucket table full (max_entries %d): evicted %d of the fullest old buckets "
                "(their tags start afresh); many new tags, or raise --max-entries",
                self.throttle.max_entries,
                evicted,
                key="evicted",
            )
            self.reclaimer.note(evicted, len(self.throttle.buckets))

    def _reclaim(self, forgotten: int) -> None:
        """After a report forgot ``forgotten`` buckets (full again): once a wave of tags
        has gone, rebuild the bucket table (a dict never shrinks) and give the memory
        back (:mod:`smockron.memory`)."""
        if forgotten:
            self.reclaimer.compact(self.throttle.buckets)
            self.reclaimer.note(forgotten, len(self.throttle.buckets))
        self.reclaimer.reclaim()  # also the last collection, once the wave is over

    def on_datagram(self, data: bytes, addr: Any) -> None:
        """Apply a peer's report part; garbage is counted and logged, never raised."""
        stats = self.stats
        stats.datagrams_received += 1
        try:
            part = decode_report(data, self.config.max_tag_length)
        except ProtocolError as exc:
            stats.garbage[exc.reason] += 1
            _ratelog.warning(
                "dropped bad report datagram from %s: %s", addr, exc, key="garbage:" + exc.reason
            )
            return
        if part.sender == self.sender_id:
            stats.own_echoes += 1
            return
        if not self.ledger.accept(part):
            stats.duplicates += 1
            return
        charged = self.throttle.apply_report(part.hits, self.clock.now())
        stats.parts_applied += 1
        log.debug(
            "applied report %d part %d/%d from %016x (%s): %d tags charged",
            part.seq,
            part.part + 1,
            part.parts,
            part.sender,
            addr,
            charged,
        )

    async def _report_loop(self) -> None:
        interval = self.config.report_interval
        due = self.clock.now() + interval
        while True:
            await self.clock.sleep_until(due)
            self.report_now()
            now = self.clock.now()
            due += interval
            if due <= now:  # fell behind (suspended, or a test clock leapt): skip ahead
                due = now + interval

    async def _stats_loop(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            s = self.stats
            garbage = {f"garbage_{reason}": n for reason, n in sorted(s.garbage.items())}
            log_stats(
                log,
                {
                    "queries": s.queries,
                    "refused": s.refused,
                    "connections": s.open_connections,
                    "overlong": s.overlong,
                    "buckets": len(self.throttle.buckets),
                    "evicted": self.throttle.evicted,
                    "reports_sent": s.reports_sent,
                    "parts_applied": s.parts_applied,
                    "peers": self.ledger.peers,
                    "missed": self.ledger.missed_reports,
                    **garbage,
                    "strangers": sum(getattr(t, "strangers", 0) for t in self.transports),
                },
            )

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        try:
            for listen in self.config.listen:
                await self._listen(listen)
            await self._start_peers()
            self.started = True
            if self.metrics:
                self.listener = self.observe(self.metrics)
        except BaseException:
            await self.stop()
            raise
        self._tasks.append(asyncio.create_task(self._report_loop()))
        if self._stats_every:
            self._tasks.append(asyncio.create_task(self._stats_loop(self._stats_every)))
        log.info(
            "dthrottle serving on %s: burst %d, rate %g/s, %d rules, %d whitelisted, "
            "reports every %gs",
            ", ".join(self.addresses),
            self.config.burst,
            self.config.rate,
            len(self.config.rules),
            len(self.config.whitelist),
            self.config.report_interval,
        )

    async def _listen(self, listen: Listen) -> None:
        loop = asyncio.get_running_loop()
        if listen.kind == "unix":
            _clear_stale_socket(listen.path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # Owner and group only, from the moment the file exists (Linux gives the file
            # the socket's mode at bind): anyone else could query or flood the daemon.
            os.fchmod(sock.fileno(), SOCKET_MODE)
            sock.bind(listen.path)
            os.chmod(listen.path, SOCKET_MODE)
            server = await loop.create_unix_server(
                lambda: LineProtocol(self), sock=sock, backlog=4096
            )
            self._unix_paths.append(listen.path)
            self.addresses.append(str(listen))
        else:
            server = await loop.create_server(
                lambda: LineProtocol(self),
                listen.host,
                listen.port,
                backlog=4096,
                reuse_address=True,
            )
            host, port = server.sockets[0].getsockname()[:2]
            for sock in server.sockets:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.addresses.append(f"tcp:{host}:{port}")
        self.servers.append(server)

    async def _start_peers(self) -> None:
        config = self.config
        bind = config.udp_bind
        if bind is not None:
            self.transports.append(UnicastPeers(bind, config.peers))
        if config.multicast is not None:
            group, port = config.multicast
            self.transports.append(
                MulticastPeers(group, port, config.multicast_interface, config.multicast_ttl)
            )
        if not self.transports:
            log.warning("no peers configured (--peer or --multicast): throttling locally only")
        for transport in self.transports:
            await transport.start(self.on_datagram)

    def tcp_port(self) -> int:
        """The first TCP port listened on (useful with port 0)."""
        for address in self.addresses:
            if address.startswith("tcp:"):
                return int(address.rsplit(":", 1)[1])
        raise LookupError("no TCP listener")

    async def stop(self) -> None:
        self.started = False
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for server in self.servers:
            server.close()
        for server in self.servers:
            await server.wait_closed()
        self.servers.clear()
        for transport in self.transports:
            transport.close()
        for path in self._unix_paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._unix_paths.clear()


def _clear_stale_socket(path: str) -> None:
    """Remove a socket file left by a crashed daemon; refuse to steal a live one."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"{path!r} exists and is not a socket: refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise ConfigError(f"another process is serving on {path!r}")
