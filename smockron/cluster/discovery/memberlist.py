"""Member-list discovery: Gubernator's default, hashicorp/memberlist's gossip spoken here.

Each node is a member with a name, a gossip address (UDP and TCP on one port) and
metadata: Gubernator's PeerInfo as JSON, naming its gRPC address (memberlist.go). A node
joins by a TCP push/pull with the known nodes (``GUBER_MEMBERLIST_KNOWN_NODES``), retried
every 300 ms as Gubernator does; then, as memberlist does, it pings one member per probe
interval (UDP, then indirect pings through up to three others), suspects one that does
not answer and declares it dead when the suspicion times out, gossips alive/suspect/dead
news to a few members each gossip interval, and runs a push/pull with one member every
push/pull interval. Timings default to memberlist's ``DefaultWANConfig``, Gubernator's.

With ``GUBER_MEMBERLIST_SECRET_KEYS``, packets and streams are encrypted as memberlist
does (AES-GCM, the first key encrypting, every key tried). What is not spoken: labels,
user messages (Gubernator sends none), sending compressed messages (read, never
written: memberlist takes both), awareness-scaled probe intervals and the protocol
version negotiation beyond checking each member's versions.

The members' states, suspicions and news queue are memberlist_members, the probes
memberlist_probe, the bytes memberlist_wire; here the rest of the I/O: joining,
push/pull streams, packets, gossip.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from smockron.cluster.discovery import memberlist_wire as wire
from smockron.cluster.discovery._common import DiscoveryMetrics, Publisher, cancel_task
from smockron.cluster.discovery.base import DISCOVERY, OnChange, PeerInfo
from smockron.cluster.discovery.memberlist_members import (
    Member,
    Suspicion,
    ip_bytes,
)
from smockron.cluster.discovery.memberlist_probe import Probing
from smockron.errors import ConfigError
from smockron.ratelog import RateLimitedLog
from smockron.settings import parse_host_port

log = logging.getLogger("smockron.cluster.discovery.memberlist")

DEFAULT_PORT = 7946
UDP_BUFFER = 1400
"""memberlist's UDPBufferSize: gossip packets stay below it."""
JOIN_RETRY = 0.3


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, owner: MemberListDiscovery) -> None:
        self._owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self._owner.packet(data, addr)

    def error_received(self, exc: Exception) -> None:
        pass  # an ICMP error for an earlier packet: the probe finds out


@DISCOVERY.register
class MemberListDiscovery(Probing):
    """Peers from a memberlist cluster; ``advertise`` is what this node's metadata names."""

    schemes = ("member-list",)

    def __init__(
        self,
        advertise: PeerInfo,
        address: str,
        *,
        bind_address: str = "",
        known_nodes: Sequence[str] = (),
        node_name: str = "",
        secret_keys: Sequence[str] = (),
        gossip_verify_incoming: bool = True,
        gossip_verify_outgoing: bool = True,
        probe_interval: float = 5.0,
        probe_timeout: float = 3.0,
        gossip_interval: float = 0.5,
        gossip_nodes: int = 4,
        push_pull_interval: float = 60.0,
        suspicion_mult: int = 6,
        suspicion_max_mult: int = 6,
        retransmit_mult: int = 4,
        gossip_to_the_dead: float = 60.0,
        tcp_timeout: float = 30.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``address``: where others reach our gossip (GUBER_MEMBERLIST_ADDRESS);
        ``bind_address``: where it listens ("" = every interface, that port);
        ``secret_keys``: base64 AES keys, the first encrypting (none: plaintext)."""
        self._keys = wire.secret_keys(secret_keys)
        self._verify_in = gossip_verify_incoming
        self._encrypt = bool(self._keys) and gossip_verify_outgoing
        self._overhead = wire.ENCRYPT_OVERHEAD if self._encrypt else 0
        self.me = advertise
        self.meta = wire.encode_meta(advertise)
        self.name = node_name or socket.gethostname()
        self._host, self.port = _host_port(address, "GUBER_MEMBERLIST_ADDRESS")
        bind = bind_address or f"0.0.0.0:{self.port}"
        self._bind = _host_port(bind, "GUBER_MEMBERLIST_BIND_ADDRESS", listen=True)
        self.known_nodes = list(known_nodes)
        for node in self.known_nodes:
            if not node.strip():
                raise ConfigError("GUBER_MEMBERLIST_KNOWN_NODES has an empty entry")
        self.probe_interval, self.probe_timeout = probe_interval, probe_timeout
        self.gossip_interval, self.gossip_nodes = gossip_interval, gossip_nodes
        self.push_pull_interval, self.tcp_timeout = push_pull_interval, tcp_timeout
        self._suspicion_mult, self._suspicion_max = suspicion_mult, suspicion_max_mult
        self._retransmit_mult, self._to_the_dead = retransmit_mult, gossip_to_the_dead
        self.metrics = DiscoveryMetrics("member-list", registry)
        self._rlog = RateLimitedLog(log)
        self.members: dict[str, Member] = {}
        self._incarnation = 0
        self._seq = 0
        self._acks: dict[int, Callable[[], None]] = {}
        self._queue: list[list[Any]] = []  # [node name, message, transmits]
        self._suspicions: dict[str, Suspicion] = {}
        self._probe_order: list[str] = []
        self._leaving = False
        self._publisher: Publisher | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.addr = b""
        self.joined = asyncio.Event()

    # -- life cycle -----------------------------------------------------------------------
    async def start(self, on_change: OnChange) -> None:
        loop = asyncio.get_running_loop()
        self.addr = ip_bytes(await _resolve_one(self._host))
        self._publisher = Publisher(on_change, self.me)
        host, port = self._bind
        self._udp, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=(host or "0.0.0.0", port)
        )
        self._tcp = await asyncio.start_server(self._serve_stream, host or "0.0.0.0", port)
        self._incarnation = 1
        self._alive(
            {
                "Incarnation": 1,
                "Node": self.name,
                "Addr": self.addr,
                "Port": self.port,
                "Meta": self.meta,
                "Vsn": wire.VSN,
            },
            bootstrap=True,
        )
        self._publish()
        if not await self._join():
            self._tasks.append(loop.create_task(self._join_loop()))
        for every, step in (
            (self.probe_interval, self._probe_next),
            (self.gossip_interval, self._gossip),
            (self.push_pull_interval, self._push_pull_random),
        ):
            self._tasks.append(loop.create_task(self._every(every, step)))

    async def stop(self) -> None:
        """Leave as memberlist's Leave does: a dead message about ourselves (left) to
        every member, so they drop us at once."""
        self._leaving = True
        me = self.members.get(self.name)
        if me is not None and self._udp is not None:
            left = wire.encode(
                wire.DEAD,
                "dead",
                {"Incarnation": me.incarnation, "Node": self.name, "From": self.name},
            )
            for member in self._live(exclude_self=True):
                self._send(member.target, left)
        for task in self._tasks:
            await cancel_task(task)
        for suspicion in self._suspicions.values():
            suspicion.cancel()
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp.wait_closed(), 1.0)

    async def _every(self, interval: float, step: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))
            try:
                result = step()
                if asyncio.iscoroutine(result):
                    await result
            except Exception as exc:  # a round fails; the next one runs
                self.metrics.errors.inc()
                self._rlog.warning(
                    "member-list: %s failed: %s", step.__name__, exc, key=step.__name__
                )

    # -- joining and push/pull ------------------------------------------------------------
    async def _join(self) -> bool:
        """One round over the known nodes (every address each resolves to); True when
        at least one answered, as memberlist's Join counts."""
        joined = 0
        for node in self.known_nodes:
            try:
                targets = await _resolve_all(node, self.port)
            except (OSError, ValueError) as exc:
                self._rlog.warning(
                    "member-list: cannot resolve %s: %s", node, exc, key=f"resolve {node}"
                )
                continue
            for target in targets:
                try:
                    await self._push_pull(target, join=True, timeout=min(self.tcp_timeout, 5.0))
                    joined += 1
                except (OSError, TimeoutError, wire.Malformed) as exc:
                    log.debug("member-list: join %s: %s", target, exc)
        if joined or not self.known_nodes:
            self.joined.set()
        return joined > 0 or not self.known_nodes

    async def _join_loop(self) -> None:
        while not await self._join():
            self.metrics.errors.inc()
            self._rlog.warning(
                "member-list: no known node answered (%s); retrying",
                ", ".join(self.known_nodes),
                key="join",
            )
            await asyncio.sleep(JOIN_RETRY)
        log.info("member-list: joined through %s", ", ".join(self.known_nodes))

    async def _push_pull_random(self) -> None:
        others = self._live(exclude_self=True, alive_only=True)
        if others:
            await self._push_pull(random.choice(others).target, join=False)

    async def _push_pull(
        self, target: tuple[str, int], join: bool, timeout: float | None = None
    ) -> None:
        timeout = self.tcp_timeout if timeout is None else timeout
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*target), timeout)
        try:
            writer.write(self._sealed(self._local_state(join)))
            await writer.drain()
            kind, message = await asyncio.wait_for(self._read_stream(reader), timeout)
        finally:
            writer.close()
        if kind == wire.ERR:
            raise wire.Malformed(f"remote error: {message['Error']}")
        if kind != wire.PUSH_PULL:
            raise wire.Malformed(f"received message type {kind}, expected push/pull")
        self._merge(message.nodes)

    def _local_state(self, join: bool) -> bytes:
        nodes = [m.pushed() for m in self.members.values()]
        return wire.encode_push_pull(wire.PushPull(join, nodes))

    async def _serve_stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = writer.get_extra_info("peername")
        try:
            kind, message = await asyncio.wait_for(self._read_stream(reader), self.tcp_timeout)
            if kind == wire.PUSH_PULL:
                writer.write(self._sealed(self._local_state(message.join)))
                await writer.drain()
                self._merge(message.nodes)
            elif kind == wire.PING and message["Node"] in ("", self.name):
                writer.write(
                    self._sealed(wire.encode(wire.ACK, "ack", {"SeqNo": message["SeqNo"]}))
                )
                await writer.drain()
            else:
                raise wire.Malformed(f"unexpected stream message type {kind}")
        except wire.Malformed as exc:
            self._malformed(exc, peer)
            writer.write(self._sealed(wire.encode(wire.ERR, "err", {"Error": str(exc)[:200]})))
        except (OSError, TimeoutError) as exc:
            log.debug("member-list: stream from %s: %s", peer, exc)
        finally:
            writer.close()

    def _merge(self, nodes: Iterable[dict[str, Any]]) -> None:
        """memberlist's mergeState; a bad entry is counted and skipped, the rest merged."""
        for node in nodes:
            node["Port"] = node["Port"] or self.port
            if node["State"] == wire.STATE_ALIVE:
                try:
                    self._alive(
                        {
                            "Incarnation": node["Incarnation"],
                            "Node": node["Name"],
                            "Addr": node["Addr"],
                            "Port": node["Port"],
                            "Meta": node["Meta"],
                            "Vsn": node["Vsn"],
                        }
                    )
                except wire.Malformed as exc:
                    self._malformed(exc, "a push/pull")
            elif node["State"] == wire.STATE_LEFT:
                self._dead(node["Incarnation"], node["Name"], node["Name"])
            elif node["State"] in (wire.STATE_DEAD, wire.STATE_SUSPECT):
                self._suspect(node["Incarnation"], node["Name"], self.name)

    # -- packets --------------------------------------------------------------------------
    def packet(self, data: bytes, source: tuple[str, int]) -> None:
        """One UDP packet, treated as hostile: anything malformed is counted and logged."""
        try:
            for kind, body in wire.messages(wire.unwrap_packet(data, self._keys, self._verify_in)):
                self._command(kind, body, source)
        except wire.Malformed as exc:
            self._malformed(exc, source)

    def _command(self, kind: int, body: bytes, source: tuple[str, int]) -> None:
        if kind == wire.PING:
            self._ping(wire.decode("ping", body), source)
        elif kind == wire.INDIRECT_PING:
            self._indirect_ping(wire.decode("indirect_ping", body), source)
        elif kind == wire.ACK:
            callback = self._acks.pop(wire.decode("ack", body)["SeqNo"], None)
            if callback is not None:
                callback()
        elif kind == wire.NACK:
            wire.decode("nack", body)
        elif kind == wire.ALIVE:
            alive = wire.decode("alive", body)
            alive["Port"] = alive["Port"] or self.port
            self._alive(alive)
        elif kind == wire.SUSPECT:
            s = wire.decode("suspect", body)
            self._suspect(s["Incarnation"], s["Node"], s["From"])
        elif kind == wire.DEAD:
            d = wire.decode("dead", body)
            self._dead(d["Incarnation"], d["Node"], d["From"])
        elif kind != wire.USER:
            raise wire.Malformed(f"message type {kind} not supported")

    # -- gossip ---------------------------------------------------------------------------
    def _gossip(self) -> None:
        now = self._now()
        targets = [
            m
            for m in self.members.values()
            if m.name != self.name
            and (
                m.state in (wire.STATE_ALIVE, wire.STATE_SUSPECT)
                or (m.state == wire.STATE_DEAD and now - m.changed <= self._to_the_dead)
            )
        ]
        for member in random.sample(targets, min(self.gossip_nodes, len(targets))):
            news = self._take_broadcasts(UDP_BUFFER - 2 - self._overhead)
            if not news:
                return
            self._send(member.target, news[0] if len(news) == 1 else wire.make_compound(news))

    def _send_gossiping(self, target: tuple[str, int], message: bytes) -> None:
        """``message`` with what news fits beside it (memberlist's sendMsg)."""
        news = self._take_broadcasts(UDP_BUFFER - len(message) - 4 - self._overhead)
        self._send(target, wire.make_compound([message, *news]) if news else message)

    def _send(self, target: tuple[str, int], packet: bytes) -> None:
        if self._udp is not None and not self._udp.is_closing():
            if self._encrypt:
                packet = wire.encrypt(self._keys[0], packet)
            self._udp.sendto(packet, target)

    def _sealed(self, stream: bytes) -> bytes:
        """A stream message, encrypted when the gossip is (net.go rawSendMsgStream)."""
        return wire.encrypt_stream(self._keys[0], stream) if self._encrypt else stream

    async def _read_stream(self, reader: asyncio.StreamReader) -> tuple[int, Any]:
        """One stream message, read until whole (memberlist sends no end marker)."""
        data = b""
        while True:
            try:
                return wire.read_stream(data, self._keys, self._verify_in)
            except wire.Truncated:
                chunk = await reader.read(65536)
                if not chunk:
                    raise wire.Malformed("stream ended inside a message") from None
                data += chunk
                if len(data) > wire.MAX_STATE_BYTES + 5:
                    raise wire.Malformed("remote node state is larger than limit") from None

    # -- helpers --------------------------------------------------------------------------


def _host_port(text: str, what: str, listen: bool = False) -> tuple[str, int]:
    try:
        return parse_host_port(text, listen=listen)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


async def _resolve_all(node: str, default_port: int) -> list[tuple[str, int]]:
    """A known node, ``host``, ``host:port`` or ``[v6]:port``, as every address its name
    has (memberlist's resolveAddr); the port defaults to ours."""
    text = node.strip()
    if text.count(":") == 1 or text.startswith("["):
        host, port = parse_host_port(text)
    else:
        host, port = text.strip("[]"), default_port
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys((str(info[4][0]), port) for info in infos))


async def _resolve_one(host: str) -> str:
    """Memberlist needs an IP to advertise: a name is looked up (its first address)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    if not infos:
        raise ConfigError(f"GUBER_MEMBERLIST_ADDRESS: {host!r} has no address")
    return str(infos[0][4][0])
