"""memberlist's view of the members, without I/O but the sending of news: each member's
state (aliveNode, suspectNode, deadNode, refute, the reaping of the long gone), the
suspicion timers, and the queue of news gossiped with every packet. The discovery
(smockron.cluster.discovery.memberlist) is built on it."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smockron.cluster.discovery import memberlist_wire as wire
from smockron.cluster.discovery._common import DiscoveryMetrics, Publisher
from smockron.cluster.discovery.base import PeerInfo
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.cluster.discovery.memberlist")

MAX_MEMBERS = 10_000
"""Alive news about more nodes than this is refused: without encryption anyone who can
send a packet can announce members, and they must not grow without bound."""


@dataclass
class Member:
    """One node as memberlist's nodeState holds it."""

    name: str
    addr: bytes
    port: int
    meta: bytes | None
    incarnation: int
    state: int
    vsn: bytes
    changed: float
    peer: PeerInfo | None = None
    """Its metadata read as a peer; None when unreadable (it then routes nothing)."""

    @property
    def target(self) -> tuple[str, int]:
        return ip_text(self.addr), self.port

    def pushed(self) -> dict[str, Any]:
        return {
            "Name": self.name,
            "Addr": self.addr,
            "Port": self.port,
            "Meta": self.meta,
            "Incarnation": self.incarnation,
            "State": self.state,
            "Vsn": self.vsn,
        }


def ip_text(addr: bytes) -> str:
    if len(addr) == 4:
        return str(ipaddress.IPv4Address(addr))
    if len(addr) == 16:
        ip = ipaddress.IPv6Address(addr)
        return str(ip.ipv4_mapped or ip)
    raise wire.Malformed(f"address of {len(addr)} bytes")


def ip_bytes(text: str) -> bytes:
    return ipaddress.ip_address(text).packed


class Suspicion:
    """memberlist's suspicion.go: the timeout shrinks from ``high`` towards ``low`` as
    other members confirm (``k`` confirmations expected)."""

    def __init__(
        self, origin: str, k: int, low: float, high: float, fire: Callable[[], None]
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self._seen = {origin}
        self._k, self._low, self._high, self._fire = k, low, high, fire
        self._handle = self._loop.call_at(self._start + (high if k >= 1 else low), fire)

    def confirm(self, origin: str) -> bool:
        n = len(self._seen) - 1
        if n >= self._k or origin in self._seen:
            return False
        self._seen.add(origin)
        frac = math.log(n + 2) / math.log(self._k + 1)
        timeout = max(self._low, self._high - frac * (self._high - self._low))
        self._handle.cancel()
        self._handle = self._loop.call_at(self._start + timeout, self._fire)
        return True

    def cancel(self) -> None:
        self._handle.cancel()


class MemberStates:
    """The members part of ``MemberListDiscovery``; its state is set up there."""

    name: str
    me: PeerInfo
    members: dict[str, Member]
    metrics: DiscoveryMetrics
    probe_interval: float
    _rlog: RateLimitedLog
    _incarnation: int
    _queue: list[list[Any]]
    _suspicions: dict[str, Suspicion]
    _leaving: bool
    _publisher: Publisher | None
    _suspicion_mult: int
    _suspicion_max: int
    _retransmit_mult: int
    _to_the_dead: float

    def _send(self, target: tuple[str, int], packet: bytes) -> None:
        raise NotImplementedError

    # -- state: memberlist's aliveNode, suspectNode, deadNode -----------------------------
    def _alive(self, a: dict[str, Any], bootstrap: bool = False) -> None:
        name, vsn = a["Node"], a["Vsn"] or b""
        if (self._leaving and name == self.name) or not name:
            return
        if len(vsn) >= 3 and (vsn[0] == 0 or vsn[1] == 0 or vsn[0] > vsn[1]):
            raise wire.Malformed(f"alive for {name}: wrong protocol versions {list(vsn)}")
        ip_text(a["Addr"] or b"")  # a malformed address stops here
        found = self._alive_member(name, a, vsn)
        if found is None:
            return
        member, moved = found
        local = name == self.name
        if a["Incarnation"] <= member.incarnation and not local and not moved:
            return
        if a["Incarnation"] < member.incarnation and local:
            return
        self._cancel_suspicion(name)
        old_state = member.state
        if local and not bootstrap:
            if (a["Incarnation"], a["Meta"], vsn) != (member.incarnation, member.meta, member.vsn):
                self._refute(member, a["Incarnation"])
            return
        self._broadcast(name, wire.encode(wire.ALIVE, "alive", a))
        member.incarnation, member.meta, member.vsn = a["Incarnation"], a["Meta"], vsn
        member.addr, member.port = a["Addr"], a["Port"]
        member.peer = self._peer_of(member)
        if old_state != wire.STATE_ALIVE:
            member.state, member.changed = wire.STATE_ALIVE, self._now()
        self._publish()

    def _alive_member(self, name: str, a: dict[str, Any], vsn: bytes) -> tuple[Member, bool] | None:
        """The member an alive message is about (added, dead, if new) and whether it is a
        left one back at another address; None when another node has its name."""
        member = self.members.get(name)
        if member is None:
            if len(self.members) >= MAX_MEMBERS:
                raise wire.Malformed(f"alive for {name}: already {MAX_MEMBERS} members")
            member = Member(
                name, a["Addr"], a["Port"], a["Meta"], 0, wire.STATE_DEAD, vsn, self._now()
            )
            self.members[name] = member
            return member, False
        if (member.addr, member.port) == (a["Addr"], a["Port"]):
            return member, False
        if member.state != wire.STATE_LEFT:
            self._rlog.warning(
                "member-list: two nodes are named %s: %s:%d and %s:%d; set "
                "GUBER_MEMBERLIST_NODE_NAME (the host name by default) to tell them apart",
                name,
                ip_text(member.addr),
                member.port,
                ip_text(a["Addr"]),
                a["Port"],
                key=f"conflict {name}",
            )
            return None
        return member, True

    def _suspect(self, incarnation: int, name: str, origin: str) -> None:
        member = self.members.get(name)
        if member is None or incarnation < member.incarnation:
            return
        suspicion = self._suspicions.get(name)
        if suspicion is not None:
            if suspicion.confirm(origin):
                self._broadcast(name, self._suspect_message(incarnation, name, origin))
            return
        if member.state != wire.STATE_ALIVE:
            return
        if name == self.name:
            self._refute(member, incarnation)
            return
        self._broadcast(name, self._suspect_message(incarnation, name, origin))
        member.incarnation, member.state, member.changed = (
            incarnation,
            wire.STATE_SUSPECT,
            self._now(),
        )
        changed = member.changed
        n = len(self._live())
        k = self._suspicion_mult - 2 if n - 2 >= self._suspicion_mult - 2 else 0
        low = self._suspicion_mult * max(1.0, math.log10(max(1.0, n))) * self.probe_interval
        high = self._suspicion_max * low

        def timeout() -> None:
            self._suspicions.pop(name, None)
            now = self.members.get(name)
            if now is not None and now.state == wire.STATE_SUSPECT and now.changed == changed:
                log.info("member-list: marking %s as failed, suspect timeout reached", name)
                self._dead(now.incarnation, name, self.name)

        self._suspicions[name] = Suspicion(origin, k, low, high, timeout)

    def _suspect_message(self, incarnation: int, name: str, origin: str) -> bytes:
        return wire.encode(
            wire.SUSPECT, "suspect", {"Incarnation": incarnation, "Node": name, "From": origin}
        )

    def _dead(self, incarnation: int, name: str, origin: str) -> None:
        member = self.members.get(name)
        if member is None or incarnation < member.incarnation:
            return
        self._cancel_suspicion(name)
        if member.state in (wire.STATE_DEAD, wire.STATE_LEFT):
            return
        if name == self.name and not self._leaving:
            self._refute(member, incarnation)
            return
        self._broadcast(
            name,
            wire.encode(
                wire.DEAD, "dead", {"Incarnation": incarnation, "Node": name, "From": origin}
            ),
        )
        member.incarnation = incarnation
        member.state = wire.STATE_LEFT if name == origin else wire.STATE_DEAD
        member.changed = self._now()
        self._publish()

    def _refute(self, me: Member, accused: int) -> None:
        """memberlist's refute: an incarnation above the accusation, and the news."""
        self._incarnation = max(self._incarnation + 1, accused + 1)
        me.incarnation = self._incarnation
        self._broadcast(
            me.name,
            wire.encode(
                wire.ALIVE,
                "alive",
                {
                    "Incarnation": me.incarnation,
                    "Node": me.name,
                    "Addr": me.addr,
                    "Port": me.port,
                    "Meta": me.meta,
                    "Vsn": me.vsn,
                },
            ),
        )

    def _reap(self) -> None:
        """Forget members dead or gone for longer than news of them is gossiped
        (memberlist's resetNodes), so restarted pods under new names do not pile up."""
        now = self._now()
        for name, member in list(self.members.items()):
            gone = member.state in (wire.STATE_DEAD, wire.STATE_LEFT)
            if gone and now - member.changed > self._to_the_dead:
                del self.members[name]

    def _cancel_suspicion(self, name: str) -> None:
        suspicion = self._suspicions.pop(name, None)
        if suspicion is not None:
            suspicion.cancel()

    def _peer_of(self, member: Member) -> PeerInfo | None:
        if member.name == self.name:
            return self.me
        try:
            return wire.decode_meta(member.meta)
        except wire.Malformed as exc:
            self._malformed(exc, member.target)
            return None

    def _publish(self) -> None:
        if self._publisher is not None:
            self._publisher.publish(m.peer for m in self._live() if m.peer is not None)

    # -- news -----------------------------------------------------------------------------
    def _broadcast(self, name: str, message: bytes) -> None:
        """Queue news about ``name``; it replaces older news about the same node."""
        self._queue = [item for item in self._queue if item[0] != name]
        self._queue.append([name, message, 0])

    def _take_broadcasts(self, budget: int) -> list[bytes]:
        limit = self._retransmit_mult * math.ceil(math.log10(len(self.members) + 1))
        taken: list[bytes] = []
        for item in sorted(self._queue, key=lambda i: i[2]):
            if len(item[1]) + 2 > budget:
                continue
            budget -= len(item[1]) + 2
            taken.append(item[1])
            item[2] += 1
        self._queue = [item for item in self._queue if item[2] < limit]
        return taken

    def _live(self, exclude_self: bool = False, alive_only: bool = False) -> list[Member]:
        states = (wire.STATE_ALIVE,) if alive_only else (wire.STATE_ALIVE, wire.STATE_SUSPECT)
        return [
            m
            for m in self.members.values()
            if m.state in states and not (exclude_self and m.name == self.name)
        ]

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _malformed(self, exc: Exception, source: object) -> None:
        self.metrics.malformed.inc()
        self._rlog.warning(
            "member-list: malformed message from %s: %s", source, exc, key="malformed"
        )
