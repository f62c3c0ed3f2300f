"""The router's side towards its masters' control (see :mod:`smockron.master.router`):
one SUB per master read in order, DELAY_UNTILs relayed and counted, the masters' publish
counters taken into the router's own (:class:`~smockron.master.relay.Counters`), rules
offers relayed once a period (:class:`~smockron.master.relay.Offers`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import zmq

from smockron.errors import ProtocolError
from smockron.master.relay import Counters, Offers
from smockron.master.server import RULES_EVERY_S
from smockron.ratelog import RateLimitedLog
from smockron.wire.batchio import drain, send_all, wait_readable
from smockron.wire.codec import (
    DELAY_UNTIL,
    PUBLISHED,
    RESYNCSTART,
    RULES,
    RULES_TOPIC,
    decode_published,
    encode_published,
    frame_count,
)
from smockron.wire.fleet import SYNC_PREFIX

POKE_S = 0.05
"""How often the PUB sockets are poked (``Router._poke``)."""


@dataclass(slots=True)
class _Upstream:
    """One master's control connection."""

    index: int
    address: str
    sock: zmq.Socket[bytes]
    held: list[bytes] | None = None
    """A rules offer not relayed (a duplicate), kept while it is the last message read:
    relayed after all if a RESYNCSTART follows it (the master sends the offer right
    before a resync's answer, for a gatekeeper that has just connected)."""


class _ControlRelay:
    """What ``Router`` does with its masters' control (a mixin: the sockets are its)."""

    batch: int
    control_out: zmq.Socket[bytes]
    counters: Counters
    offers: Offers
    relayed: int
    control_discarded: int
    control_log: RateLimitedLog
    _watched: list[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]

    def _events(self, i: int) -> None: ...

    def _poke(self) -> None: ...

    async def _control(self, up: _Upstream) -> None:
        """One master's control: relayed in order, but for its publish counters (taken
        into the router's own) and the rules offers other masters sent already."""
        counts: dict[bytes, int] = {}
        watched = next(i for i, (sock, _m) in enumerate(self._watched) if sock is up.sock)
        while True:
            self._events(watched)  # a lost connection first: it precedes what follows
            batch = drain(up.sock, self.batch)
            if not batch:
                await wait_readable(up.sock, 0.25)
                continue
            relay = self._sorted(up, batch, counts, time.monotonic())
            if counts:  # counted before they are sent: the counter goes out after them
                self.counters.delivered(up.index, counts)
                counts.clear()
            if relay:
                self.relayed += send_all(self.control_out, relay)
            await asyncio.sleep(0)

    def _sorted(
        self, up: _Upstream, batch: list[list[bytes]], counts: dict[bytes, int], now: float
    ) -> list[list[bytes]]:
        """What of a batch of master ``up``'s control goes to the gatekeepers, in order;
        its DELAY_UNTILs counted per domain in ``counts``."""
        relay: list[list[bytes]] = []
        for frames in batch:
            head = frames[0]
            second = frames[1] if len(frames) > 1 else b""
            if type(frames) is not list:  # more frames than any message: not ours
                self._oversized(up, frames)
            elif second == DELAY_UNTIL and head[:1] != b"\0":
                counts[head] = counts.get(head, 0) + 1
                relay.append(frames)
            elif head[:1] == b"\0" and head.startswith(SYNC_PREFIX):
                continue  # a master's answer to a peer's warm start: not for gatekeepers
            elif head == RULES_TOPIC and second in (PUBLISHED, RULES):
                self._rules_topic(up, frames, counts, relay, now)
                continue  # (keeps or sets up.held)
            else:
                if second == RESYNCSTART and up.held is not None:
                    relay.append(up.held)
                relay.append(frames)
            up.held = None
        return relay

    def _rules_topic(
        self,
        up: _Upstream,
        frames: list[bytes],
        counts: dict[bytes, int],
        relay: list[list[bytes]],
        now: float,
    ) -> None:
        """A publish counter (taken into the router's own, after the DELAY_UNTILs that
        came before it) or a rules offer (relayed when fresh, else held, see
        :class:`_Upstream`)."""
        if frames[1] == PUBLISHED:
            if counts:  # what it counts came before it: counted first
                self.counters.delivered(up.index, counts)
                counts.clear()
            self._heartbeat(up, frames, now)  # keeps up.held: the counters go out with the offers
        elif self.offers.fresh(frames, up.index, now):
            relay.append(frames)
            up.held = None
        else:
            up.held = frames

    def _oversized(self, up: _Upstream, frames: Sequence[bytes]) -> None:
        self.control_discarded += 1
        self.control_log.warning(
            "master %s sent a control message of %d frames: not relayed",
            up.address,
            frame_count(frames),
            key="frames",
        )

    def _heartbeat(self, up: _Upstream, frames: Sequence[bytes], now: float) -> None:
        try:
            domain, published = decode_published(frames)
        except ProtocolError as exc:
            self.control_discarded += 1
            self.control_log.warning(
                "master %s sent a malformed publish counter: %s", up.address, exc, key="counter"
            )
            return
        lost = self.counters.heartbeat(up.index, domain + b"\0", published, now)
        if lost:
            self.control_log.warning(
                "lost %d DELAY_UNTIL(s) for %r from master %s (its queue towards the "
                "router was full): the router's counter shows them to the gatekeepers, "
                "which ask for a resync",
                lost,
                domain[:64],
                up.address,
                key="lost",
            )

    async def _publish_counts(self) -> None:
        """The router's publish counter of each domain, once a period; between two,
        the PUB sockets are poked (see :meth:`_poke`)."""
        while True:
            for _ in range(max(1, round(RULES_EVERY_S / POKE_S))):
                await asyncio.sleep(POKE_S)
                self._poke()
            if self.offers.disagree:
                self.control_log.warning(
                    "the masters offer different rules for a domain "
                    "(%d times): run them with the same rules",
                    self.offers.disagree,
                    key="disagree",
                )
                self.offers.disagree = 0
            counts = [encode_published(d, n) for d, n in self.counters.current(time.monotonic())]
            if counts:
                with contextlib.suppress(zmq.ZMQError):
                    send_all(self.control_out, counts)
