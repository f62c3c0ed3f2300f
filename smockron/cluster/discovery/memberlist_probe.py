"""memberlist's failure detection (state.go probeNode): one member pinged per probe
interval over UDP, then indirectly through up to three others, suspected when nobody
acks; and the answers this node gives to others' pings and indirect pings. The
discovery (smockron.cluster.discovery.memberlist) is built on it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

from smockron.cluster.discovery import memberlist_wire as wire
from smockron.cluster.discovery.memberlist_members import Member, MemberStates, ip_text

log = logging.getLogger("smockron.cluster.discovery.memberlist")


class Probing(MemberStates):
    """The probes part of ``MemberListDiscovery``; its state is set up there."""

    addr: bytes
    port: int
    probe_timeout: float
    _seq: int
    _acks: dict[int, Callable[[], None]]
    _probe_order: list[str]

    def _send_gossiping(self, target: tuple[str, int], message: bytes) -> None:
        raise NotImplementedError

    async def _probe_next(self) -> None:
        """memberlist's probe: the next member in a shuffled round, skipping ourselves and
        the dead."""
        for _ in range(len(self.members) + 1):
            if not self._probe_order:
                self._reap()
                self._probe_order = [n for n in self.members if n != self.name]
                random.shuffle(self._probe_order)
                if not self._probe_order:
                    return
            member = self.members.get(self._probe_order.pop())
            if member is not None and member.state in (wire.STATE_ALIVE, wire.STATE_SUSPECT):
                await self._probe(member)
                return

    async def _probe(self, member: Member) -> None:
        loop = asyncio.get_running_loop()
        seq = self._next_seq()
        answered = loop.create_future()
        self._acks[seq] = lambda: None if answered.done() else answered.set_result(True)
        ping = self._ping_message(seq, member.name)
        try:
            if member.state == wire.STATE_ALIVE:
                self._send_gossiping(member.target, ping)
            else:
                suspect = wire.encode(
                    wire.SUSPECT,
                    "suspect",
                    {"Incarnation": member.incarnation, "Node": member.name, "From": self.name},
                )
                self._send(member.target, wire.make_compound([ping, suspect]))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(answered), self.probe_timeout)
                return
            ind = wire.encode(
                wire.INDIRECT_PING,
                "indirect_ping",
                {
                    "SeqNo": seq,
                    "Target": member.addr,
                    "Port": member.port,
                    "Node": member.name,
                    "SourceAddr": self.addr,
                    "SourcePort": self.port,
                    "SourceNode": self.name,
                },
            )
            helpers = [
                m for m in self._live(exclude_self=True, alive_only=True) if m.name != member.name
            ]
            for helper in random.sample(helpers, min(3, len(helpers))):
                self._send(helper.target, ind)
            rest = max(self.probe_interval - self.probe_timeout, 0.1)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(answered), rest)
                return
            log.info("member-list: suspect %s has failed, no acks received", member.name)
            self._suspect(member.incarnation, member.name, self.name)
        finally:
            self._acks.pop(seq, None)
            answered.cancel()

    def _ping_message(self, seq: int, node: str) -> bytes:
        return wire.encode(
            wire.PING,
            "ping",
            {
                "SeqNo": seq,
                "Node": node,
                "SourceAddr": self.addr,
                "SourcePort": self.port,
                "SourceNode": self.name,
            },
        )

    # -- answering others' probes -----------------------------------------------------------
    def _ping(self, ping: dict[str, Any], source: tuple[str, int]) -> None:
        if ping["Node"] not in ("", self.name):
            self._rlog.warning(
                "member-list: ping for node %s, not this one (%s) from %s",
                ping["Node"],
                self.name,
                source,
                key="ping-name",
            )
            return
        reply_to = source
        if ping["SourceAddr"] and ping["SourcePort"]:
            reply_to = (ip_text(ping["SourceAddr"]), ping["SourcePort"])
        self._send_gossiping(reply_to, wire.encode(wire.ACK, "ack", {"SeqNo": ping["SeqNo"]}))

    def _indirect_ping(self, ind: dict[str, Any], source: tuple[str, int]) -> None:
        reply_to = source
        if ind["SourceAddr"] and ind["SourcePort"]:
            reply_to = (ip_text(ind["SourceAddr"]), ind["SourcePort"])
        seq = self._next_seq()
        acked = False

        def relay() -> None:
            nonlocal acked
            acked = True
            self._send(reply_to, wire.encode(wire.ACK, "ack", {"SeqNo": ind["SeqNo"]}))

        def nack() -> None:
            self._acks.pop(seq, None)
            if ind["Nack"] and not acked:
                self._send(reply_to, wire.encode(wire.NACK, "nack", {"SeqNo": ind["SeqNo"]}))

        self._acks[seq] = relay
        asyncio.get_running_loop().call_later(self.probe_timeout, nack)
        target = (ip_text(ind["Target"]), ind["Port"] or self.port)
        self._send(target, self._ping_message(seq, ind["Node"]))

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq
