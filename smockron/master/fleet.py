"""A master's fleet: which shards it holds, what it subscribes to, and its warm start.

Masters of one fleet never exchange live traffic: each gatekeeper publishes every
accounting message on its identifier's shard topic (:mod:`smockron.core.shards`) to a PUB
connected to every master, and ZeroMQ delivers it to the masters subscribed to that shard
(``replicas`` of them). So each of them holds the shard's states on its own, any one of
them can be killed, and a fleet of N masters processes each message ``replicas`` times,
whatever N.

What a (re)started master lacks is the past: the states its shards' other holders kept
while it was down. Before it is ready it asks each peer for them (``SYNC`` on the peer's
accounting socket, answered privately on the peer's control socket, see
:mod:`smockron.wire.fleet`) and merges what comes into its store: a history takes the
union of both sides' timestamps (the same request, seen by both, is one timestamp), GCRA
the later of the two values. Live traffic is received and applied meanwhile: a merge is
the same whichever comes first, and a master that knows less only publishes fewer
verdicts, which a gatekeeper, holding the latest of its masters' verdicts, never obeys
in place of another's.

A master cut off from its fleet and its gatekeepers for a while (a partition that heals)
missed the same past without restarting. It hears each peer's rules offer every second
(:class:`PeerWatch`); a peer heard again after ``GONE_S`` of silence is asked for the
same states as at start, so a partition costs no more than a kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from smockron.core.shards import SHARDS, encode_shards, owned, shard_of, shard_prefix
from smockron.curve import CurveClient, keep_alive
from smockron.errors import ProtocolError
from smockron.master.config import MasterSettings
from smockron.master.stores.base import Scope, State, Table, expires_at
from smockron.settings import parse_master
from smockron.wire.batchio import drain, wait_readable
from smockron.wire.codec import RULES_TOPIC, topic
from smockron.wire.fleet import (
    FLEET_PREFIX,
    STATES,
    SYNCDONE,
    SYNCSTART,
    decode_states,
    encode_sync,
    sync_topic,
)

log = logging.getLogger("smockron.master.fleet")

ALL_SHARDS = frozenset(range(SHARDS))
ASK_EVERY_S = 0.25
"""A SYNC is sent again this often until the peer answers SYNCSTART (the first one can
reach the peer's SUB before its subscription to us is up, and be dropped)."""
START_TIMEOUT_S = 3.0
"""A peer that does not answer within this long is taken for down: start without it."""
QUIET_TIMEOUT_S = 5.0
"""A peer that started answering and then sends nothing for this long is given up."""
GONE_S = 3.0
"""A peer whose rules offers (every second) stop for this long is taken for cut off:
heard again, it is asked for this master's shards' states."""
WATCH_EVERY_S = 0.25


@dataclass(frozen=True, slots=True)
class Peer:
    """A master's accounting and control addresses (``--peer``, the router's ``--master``)."""

    accounting: str
    control: str

    @classmethod
    def parse(cls, spec: str) -> Peer:
        return cls(*parse_master(spec))


class Fleet:
    """This master's place in its fleet, from its settings."""

    def __init__(self, settings: MasterSettings) -> None:
        self.name = settings.name
        self.peers = [Peer.parse(spec) for spec in settings.peers]
        members = [p.accounting for p in self.peers]
        self.shards = owned(self.name, members, settings.replicas) if self.peers else ALL_SHARDS

    @property
    def alone(self) -> bool:
        return not self.peers

    def subscriptions(self, domains: Iterable[str]) -> list[bytes]:
        """What the accounting SUB takes: everything alone (as a master always has);
        in a fleet, its domains (original gatekeepers and RESYNCs), its shards and the
        fleet's own messages."""
        if self.alone:
            return [b""]
        return [
            *(topic(d) for d in sorted(domains)),
            *map(shard_prefix, sorted(self.shards)),
            FLEET_PREFIX,
        ]

    def describe(self) -> str:
        if self.alone:
            return "alone"
        return (
            f"{self.name} with {len(self.peers)} peer(s), holding {len(self.shards)} of "
            f"{SHARDS} shards"
        )


def merge_state(old: State | None, new: State, scope: Scope) -> State:
    """Two masters' states of one identifier as one: the union of two histories (the
    newest ``burst`` timestamps), the later of two GCRA values."""
    if not old:
        return new
    if scope.algorithm == "gcra":
        return old if old[0] >= new[0] else new
    merged = sorted(set(old) | set(new))
    return tuple(merged[-scope.rule.burst :])


def merge_into(table: Table, scope: Scope, pairs: Sequence[tuple[bytes, State]], now: float) -> int:
    """Merge a peer's states into ``table``; how many still mattered."""
    kept = 0
    for ident, state in pairs:
        if expires_at(state, scope) <= now:
            continue
        merged = merge_state(table.get(ident), state, scope)
        table.put(ident, merged)
        if max(merged) > table.keep_after_ms:
            table.keep(ident, table.current[ident], expires_at(merged, scope))
        kept += 1
    return kept


def states_of(
    pairs: Iterable[tuple[bytes, State]], shards: frozenset[int]
) -> list[tuple[bytes, State]]:
    """The states a peer asked for: those of its shards."""
    if shards == ALL_SHARDS:
        return list(pairs)
    return [(ident, state) for ident, state in pairs if shard_of(ident) in shards]


def peer_socket(
    context: zmq.Context[Any], kind: int, curve: CurveClient | None
) -> zmq.Socket[bytes]:
    """A socket to a peer master: no linger, CURVE as a client holding the fleet's key."""
    sock: zmq.Socket[bytes] = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        curve.secure(sock)
    return sock


Merge = Callable[[bytes, list[tuple[bytes, State]]], int]
"""Merge ``(scope prefix, pairs)``; how many were kept (unknown scopes: none)."""


class WarmStart:
    """Ask every peer for this master's shards, merge what comes; ``problem`` says why
    this master is not ready yet (None once done)."""

    def __init__(
        self,
        context: zmq.Context[Any],
        fleet: Fleet,
        merge: Merge,
        curve: CurveClient | None = None,
    ) -> None:
        self.ctx = context
        self.fleet = fleet
        self.merge = merge
        self.curve = curve
        self.problem: str | None = "taking the fleet's state from its peers"
        self.states = 0
        self.answered = 0

    async def run(self) -> None:
        start = time.monotonic()
        results = await asyncio.gather(
            *(self._from(peer) for peer in self.fleet.peers), return_exceptions=True
        )
        for peer, result in zip(self.fleet.peers, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("warm start from %s failed: %s", peer.accounting, result)
            elif result:
                self.answered += 1
        self.problem = None
        if self.answered == 0:
            log.warning(
                "warm start: no peer answered within %g s; starting from this master's own state",
                START_TIMEOUT_S,
            )
        else:
            log.info(
                "warm start: %d state(s) from %d of %d peer(s) in %.3f s",
                self.states,
                self.answered,
                len(self.fleet.peers),
                time.monotonic() - start,
            )

    async def catch_up(self, peer: Peer) -> None:
        """Take ``peer``'s states of this master's shards again (it was cut off)."""
        before = self.states
        try:
            answered = await self._from(peer)
        except (zmq.ZMQError, OSError) as exc:
            log.warning("catching up with %s failed: %s", peer.accounting, exc)
            return
        if answered:
            log.info("caught up with %s: %d state(s)", peer.accounting, self.states - before)
        else:
            log.warning("catching up with %s: no answer", peer.accounting)

    async def _from(self, peer: Peer) -> bool:
        """One SYNC exchange with ``peer``; whether it answered."""
        token = os.urandom(8).hex().encode()
        reply = sync_topic(token)
        pub = peer_socket(self.ctx, zmq.PUB, self.curve)
        sub = peer_socket(self.ctx, zmq.SUB, self.curve)
        try:
            sub.setsockopt(zmq.RCVHWM, 0)  # a sync is paced by us: nothing dropped
            sub.subscribe(reply)
            sub.connect(peer.control)
            pub.connect(peer.accounting)
            return await self._exchange(
                pub, sub, encode_sync(token, encode_shards(self.fleet.shards)), peer
            )
        finally:
            pub.close(0)
            sub.close(0)

    async def _exchange(
        self, pub: zmq.Socket[bytes], sub: zmq.Socket[bytes], request: list[bytes], peer: Peer
    ) -> bool:
        started = False
        deadline = time.monotonic() + START_TIMEOUT_S
        asked = 0.0
        while time.monotonic() < deadline:
            if not started and time.monotonic() - asked >= ASK_EVERY_S:
                with contextlib.suppress(zmq.ZMQError):
                    pub.send_multipart(request, zmq.NOBLOCK)
                asked = time.monotonic()
            await wait_readable(sub, ASK_EVERY_S / 2)
            for frames in drain(sub, 256):
                if len(frames) < 2:
                    continue
                kind = frames[1]
                if kind == SYNCSTART and not started:
                    started = True
                elif kind == STATES and started:
                    self._take(frames, peer)
                elif kind == SYNCDONE and started:
                    return True
                deadline = time.monotonic() + QUIET_TIMEOUT_S if started else deadline
        if started:
            log.warning(
                "warm start from %s: no SYNCDONE (quiet for %g s); keeping what came",
                peer.accounting,
                QUIET_TIMEOUT_S,
            )
        return started

    def _take(self, frames: list[bytes], peer: Peer) -> None:
        try:
            scope, pairs = decode_states(frames)
        except ProtocolError as exc:
            log.warning("warm start from %s: malformed STATES message: %s", peer.accounting, exc)
            return
        self.states += self.merge(scope, pairs)


class PeerWatch:
    """Hears each peer's rules offers (its control socket's rules topic: one message a
    second per domain) and calls ``on_return`` for a peer heard again after ``GONE_S`` of
    silence, counted from the watch's start for a peer never heard."""

    def __init__(
        self,
        context: zmq.Context[Any],
        fleet: Fleet,
        on_return: Callable[[Peer], Any],
        curve: CurveClient | None = None,
    ) -> None:
        self.ctx = context
        self.fleet = fleet
        self.on_return = on_return
        self.curve = curve

    async def run(self) -> None:
        subs: list[zmq.Socket[bytes]] = []
        try:
            for peer in self.fleet.peers:
                sub = peer_socket(self.ctx, zmq.SUB, self.curve)
                subs.append(sub)
                keep_alive(sub)  # a partitioned connection is dropped and dialled again
                sub.subscribe(RULES_TOPIC)
                sub.connect(peer.control)
            heard = [time.monotonic()] * len(subs)
            while True:
                await asyncio.sleep(WATCH_EVERY_S)
                now = time.monotonic()
                for i, (peer, sub) in enumerate(zip(self.fleet.peers, subs, strict=True)):
                    if not drain(sub, 1024):
                        continue
                    if now - heard[i] >= GONE_S:
                        log.warning(
                            "peer %s heard again after %.1f s: taking its state",
                            peer.accounting,
                            now - heard[i],
                        )
                        self.on_return(peer)
                    heard[i] = now
        finally:
            for sub in subs:
                sub.close(0)
