"""What comes over a gatekeeper's control connections, and the loss detection on them.

DELAY_UNTILs fed to the decider (counted per master and domain), rules offers, the
master's publish counters (what it published that we did not receive was lost), and
the RESYNCs asked when verdicts were lost or a connection came back. No sockets are
made here: :class:`~smockron.gatekeeper._link._Link` owns them and calls in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from itertools import groupby
from typing import Final, TypeVar, cast

import zmq

from smockron.core.rules import ALGORITHMS
from smockron.errors import ProtocolError
from smockron.gatekeeper._decider import Counters, Decider
from smockron.gatekeeper._firstline import Line, describe_line
from smockron.ratelog import RateLimitedLog
from smockron.wire.batchio import send_all
from smockron.wire.codec import (
    DELAY_UNTIL,
    PUBLISHED,
    RESYNCDONE,
    RESYNCSTART,
    RULES_TOPIC,
    decode_control,
    decode_published,
    decode_rules,
    encode_resync,
    topic,
)
from smockron.wire.control import ControlBatch, ControlRecord
from smockron.wire.fleet import encode_private_resync, resync_reply

log = logging.getLogger("smockron.gatekeeper")
T = TypeVar("T")

MAX_LINES: Final = 10_000
"""Domains a gatekeeper takes rules offers for: whatever publishes on the control port
cannot make it remember unbounded domains."""
RESYNC_FIRST_RETRY_S: Final = 0.05
"""The first RESYNC after a (re)connection is often lost: sent once the accounting
connection is up, it can reach the PUB socket before the master's subscription does,
and a PUB drops what no one subscribes to. So the first retry comes after this long
(in practice at the next tick, within 0.1 s)..."""
RESYNC_RETRY_S: Final = 0.25
"""...and the next ones, while no RESYNCSTART answers, after this long..."""
RESYNC_ATTEMPTS: Final = 8
"""...at most this many times: an original master, which never answers, is not asked
without end (it logs each RESYNC as an accounting error)."""

PRIVATE_ATTEMPTS: Final = 4
"""RESYNCs sent with a reply topic before falling back to bare ones (a master that does
not know private answers: an original one, or an older smockron)."""


class _Control:
    """One master's control connection: whether it is up, and its loss detection."""

    __slots__ = ("address", "heartbeat", "index", "received", "replies", "up")

    def __init__(self, index: int, address: str | None) -> None:
        self.index = index
        self.address = address
        self.up = 0
        self.received: dict[bytes, int] = {}
        """DELAY_UNTILs received per domain we serve (bounded by ``MAX_LINES``)."""
        self.heartbeat: dict[bytes, tuple[int, int]] = {}
        """Per domain, the master's publish count and our received count at its last
        heartbeat: the next one's difference in both is what was lost meanwhile."""
        self.replies: dict[bytes, bytes] = {}
        """Our private RESYNC reply topics on this connection -> their domain."""


class _ControlMessages:
    """The control half of a gatekeeper's link to its masters (mixed into ``_Link``)."""

    decider: Decider
    counters: Counters
    master_rules: bool
    domains: frozenset[bytes] | None
    masters: list[tuple[str | None, str | None]]
    _pub: zmq.Socket[bytes] | None
    _peers: int
    _malformed_log: RateLimitedLog

    def _init_control(self) -> None:
        """One :class:`_Control` per master, and our private RESYNC reply topics."""
        self._control_topics = {topic(d): d for d in self.domains or ()}
        """Topic frame -> domain: the DELAY_UNTILs ``drain_control`` decodes for us (with
        no domains given, none: everything takes the codec's way). Our private RESYNC
        reply topics are in it too, for their domain."""
        self._controls = [_Control(k, ctl) for k, (_acc, ctl) in enumerate(self.masters)]
        token = os.urandom(8).hex().encode()
        self._reply_of: dict[tuple[int, bytes], bytes] = {}
        for link in self._controls:
            for i, domain in enumerate(sorted(self.domains or ())):
                reply = resync_reply(b"%s.%d.%d" % (token, link.index, i))
                link.replies[reply] = domain
                self._reply_of[link.index, domain] = reply
                self._control_topics[reply] = domain
        self._resync: dict[tuple[int, bytes], tuple[int, float]] = {}
        """(master, domain) to ask a RESYNC for: attempts made, and when to try again
        (monotonic)."""
        self.resyncs_requested = 0
        self.resyncs_done = 0

    def _apply_control(self, frames: list[bytes], now: int, link: int = 0) -> None:
        """Apply one control message; malformed ones are counted and logged, never raised."""
        if frames and frames[0] == RULES_TOPIC:
            if len(frames) > 1 and frames[1] == PUBLISHED:
                self._apply_published(frames, link)
            else:
                self._apply_rules(frames)
            return
        private = self._controls[link].replies.get(frames[0]) if frames else None
        if private is not None:  # our private RESYNC's answer: as on the domain's topic
            frames = [topic(private), *frames[1:]]
        control = self._decoded(decode_control, frames, "control message")
        ours = control is not None and (self.domains is None or control.domain in self.domains)
        if ours and control is not None and control.command == DELAY_UNTIL:
            self._apply_delays([(control.domain, control.identifier, control.until_ms)], now, link)
            return
        self.counters.control_received += 1
        if control is None:
            return
        if not ours:
            self.counters.control_ignored += 1
            return
        # RESYNCSTART or RESYNCDONE
        self._resync_mark(control.domain, control.command, link, private is not None)

    def _apply_batch(self, batch: ControlBatch[bytes], now: int, link: int = 0) -> None:
        """Apply messages as ``wire.control.drain_control`` gives them, in order: runs of
        DELAY_UNTILs for our domains already decoded (tuples) in one call each, anything
        else (raw frames) one at a time."""
        for kind, run in groupby(batch, type):
            if kind is tuple:
                self._apply_delays(cast("list[ControlRecord[bytes]]", list(run)), now, link)
            else:
                for frames in run:
                    self._apply_control(cast("list[bytes]", frames), now, link)

    def _apply_delays(self, records: list[ControlRecord[bytes]], now: int, link: int = 0) -> None:
        """DELAY_UNTILs ``(domain, identifier, until_ms)`` for domains we serve (decoded,
        checked): counted per domain (loss detection), then remembered."""
        self.counters.control_received += len(records)
        table = self.decider.table
        refused, evicted = table.refused, table.evicted
        counts: dict[bytes, int] = {}
        self.decider.control_many(records, now, counts)
        received = self._controls[link].received
        for domain, count in counts.items():
            if domain in received:
                received[domain] += count
            elif len(received) < MAX_LINES:
                received[domain] = count
        if table.refused != refused:
            until_ms, domain, identifier = next(
                (u, d, i) for d, i, u in records if u - now > table.max_ahead_ms
            )
            self._malformed_log.warning(
                "refusing DELAY_UNTIL %d for %r/%r: more than %d ms ahead",
                until_ms,
                domain[:64],
                identifier[:64],
                table.max_ahead_ms,
            )
        elif table.evicted != evicted:
            self._malformed_log.warning(
                "delay table full (%d entries): evicted the %d expiring soonest",
                table.max_entries,
                table.evicted - evicted,
            )

    def _resync_mark(self, domain: bytes, command: bytes, link: int, private: bool) -> None:
        """A master answers a RESYNC: it started (stop asking it), or it is done. A
        private answer is not in the master's publish count: its heartbeat baseline
        starts again."""
        if command == RESYNCSTART:
            self._resync.pop((link, domain), None)
            if private:
                self._controls[link].heartbeat.pop(domain, None)
        elif command == RESYNCDONE:
            self.resyncs_done += 1

    def _apply_published(self, frames: list[bytes], link: int = 0) -> None:
        """The master's heartbeat: how many DELAY_UNTILs it published for a domain. What
        it published since the last heartbeat and we did not receive was lost (at a
        high-water mark): counted, and the domain's live verdicts asked for again."""
        heartbeat = self._decoded(decode_published, frames, "publish counter")
        if heartbeat is None:
            return
        domain, published = heartbeat
        if self.domains is not None and domain not in self.domains:
            return
        control = self._controls[link]
        received = control.received.get(domain, 0)
        last = control.heartbeat.get(domain)
        if last is None and len(control.heartbeat) >= MAX_LINES:
            return
        control.heartbeat[domain] = (published, received)
        if last is None:  # first heartbeat since (re)connecting: our baseline
            if self.domains is None:  # subscribed to everything: domains named here
                self._want_resync((domain,), link)
            return
        if published < last[0]:  # a new master: counting starts again
            return
        lost = (published - last[0]) - (received - last[1])
        if lost > 0:
            self.counters.control_lost += lost
            self._malformed_log.warning(
                "lost %d DELAY_UNTIL(s) for %r (published %d, received %d since the last "
                "heartbeat): asking the master to resync",
                lost,
                domain[:64],
                published - last[0],
                received - last[1],
            )
            self._want_resync((domain,), link)

    def _want_resync(self, domains: Iterable[bytes], link: int) -> None:
        """Ask master ``link`` for these domains' live verdicts (:meth:`_send_resyncs`)."""
        for domain in domains:
            key = (link, domain)
            if key not in self._resync and len(self._resync) < MAX_LINES:
                self._resync[key] = (0, 0.0)

    def _send_resyncs(self) -> None:
        """Send the RESYNCs due, once the accounting socket is connected; again after
        ``RESYNC_FIRST_RETRY_S``, then every ``RESYNC_RETRY_S`` until the master answers,
        ``RESYNC_ATTEMPTS`` times at most."""
        pub = self._pub
        if not self._resync or pub is None or self._peers <= 0:
            return
        now = time.monotonic()
        bare: set[bytes] = set()  # one bare RESYNC reaches every master
        for (link, domain), (attempts, due) in list(self._resync.items()):
            if due > now:
                continue
            if attempts >= RESYNC_ATTEMPTS:
                del self._resync[link, domain]
                self._malformed_log.warning(
                    "no answer to RESYNC for %r from %s: the master may not support it",
                    domain[:64],
                    self.masters[link][1],
                )
                continue
            retry = RESYNC_FIRST_RETRY_S if attempts == 0 else RESYNC_RETRY_S
            self._resync[link, domain] = (attempts + 1, now + retry)
            reply = self._reply_of.get((link, domain))
            if reply is None or attempts >= PRIVATE_ATTEMPTS:
                if domain in bare:
                    continue
                bare.add(domain)
                message = encode_resync(domain)
            else:
                message = encode_private_resync(topic(domain), reply)
            self.resyncs_requested += 1
            with contextlib.suppress(zmq.ZMQError):
                send_all(pub, [message])

    def _decoded(
        self, decode: Callable[[list[bytes]], T], frames: list[bytes], what: str
    ) -> T | None:
        """``decode(frames)``, or None for a malformed message (counted, logged)."""
        try:
            return decode(frames)
        except ProtocolError as exc:
            self.counters.control_malformed += 1
            self._malformed_log.warning("ignoring malformed %s: %s", what, exc)
            return None

    def _apply_rules(self, frames: list[bytes]) -> None:
        """The master's offer of a domain's rules: they replace the configured ones."""
        self.counters.rules_received += 1
        offer = self._decoded(decode_rules, frames, "rules offer")
        if offer is None:
            return
        if not self.master_rules or (self.domains is not None and offer.domain not in self.domains):
            return
        if offer.domain not in self.decider.lines and len(self.decider.lines) >= MAX_LINES:
            self._malformed_log.warning(
                "ignoring rules offer for %r: %d domains have rules already",
                offer.domain[:64],
                MAX_LINES,
            )
            return
        if offer.algorithm not in ALGORITHMS:
            self._malformed_log.warning(
                "ignoring rules offer with unknown algorithm %r for %r",
                offer.algorithm,
                offer.domain,
            )
            return
        self._set_line(offer.domain, Line.of(offer.algorithm, offer.rules))

    def _set_line(self, domain: bytes, line: Line | None) -> None:
        if self.decider.set_line(domain, line):
            log.info(
                "first line for %r: %s", domain.decode("utf-8", "replace"), describe_line(line)
            )
