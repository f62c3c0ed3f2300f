"""What a master answers on request: RESYNCs from gatekeepers, SYNCs from peer masters.

Both list states from the store and go out paced (:class:`~smockron.master.control_out.
ControlOut`): as fast as the one who asked takes them, live verdicts in between.

A RESYNC with a reply topic (smockron's gatekeepers) is answered on that topic, so only
the gatekeeper that asked receives it: a restarted gatekeeper costs its domain's other
gatekeepers nothing. Each reply topic is answered at most once per ``RESYNC_EVERY_S``.
A bare RESYNC (the original's ``resync`` branch), or more private requests for one
domain at once than ``PRIVATE_MAX`` (a rolling restart, or a flood of made-up reply
topics), is answered once on the domain's topic, at most once per ``RESYNC_EVERY_S``,
which every gatekeeper of the domain receives: the cost of a flood is bounded by the
domain's size times two a second, whatever the number of requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable

import zmq

from smockron.master.control_out import ControlOut
from smockron.master.engine import Engine
from smockron.master.fleet import merge_into, states_of
from smockron.master.stats import Stats
from smockron.master.stores.base import State, Store
from smockron.wire.batchio import send_until_refused
from smockron.wire.codec import RESYNCDONE, RESYNCSTART, topic
from smockron.wire.control import send_controls
from smockron.wire.fleet import SYNCDONE, SYNCSTART, encode_states

log = logging.getLogger("smockron.master")

RESYNC_EVERY_S = 0.5
"""A domain's topic, or one reply topic, is resynced at most this often."""
PRIVATE_MAX = 8
"""Private RESYNC requests of one domain answered one by one; more waiting at once are
answered together, on the domain's topic."""
RESYNC_SLICE = 4096
"""DELAY_UNTILs a resync computes and publishes per turn of the loop: live traffic goes
in between."""
RESYNC_MAX = 1_000_000
"""Live states listed per rule of a domain for one resync, at most."""
POLL_S = 0.02
"""How often pending requests are looked at while some wait for their turn."""
IDLE_LOOK_S = 1.0
"""With none pending, the answering loops wait to be told of one (``Answers.asked``),
and look anyway this often: an idle master does not wake fifty times a second."""


class Answers:
    """The master's answers; ``offers`` is read at each resync (reloads replace it)."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        out: ControlOut,
        stats: Stats,
        offers: dict[str, list[bytes]],
    ) -> None:
        self.engine, self.store, self.out, self.stats = engine, store, out, stats
        self.offers = offers
        self.warming: Callable[[], bool] = lambda: False
        """While true (a fleet master taking its peers' state), RESYNCs wait: an answer
        from a partial store would tell a gatekeeper less than the fleet knows."""
        self._resynced: dict[tuple[str, bytes | None], float] = {}
        self.resyncs = 0
        self.syncs = 0
        self._resync_asked = asyncio.Event()
        self._sync_asked = asyncio.Event()

    def asked(self) -> None:
        """After each batch: the answering loops look now if the engine took RESYNC or
        SYNC requests (the checks are here, once)."""
        if self.engine.resync_wanted:
            self._resync_asked.set()
        if self.engine.sync_wanted:
            self._sync_asked.set()

    async def answer_resyncs(self) -> None:
        wanted = self.engine.resync_wanted
        while True:
            if wanted:  # waiting for their turn (RESYNC_EVERY_S) or for a warm start
                await asyncio.sleep(POLL_S)
            else:
                await _told(self._resync_asked)
            if self.warming():
                continue
            for name, reply in self._due(wanted, time.monotonic()):
                await self.resync(name, reply)

    def _due(
        self, wanted: dict[tuple[str, bytes | None], None], now: float
    ) -> list[tuple[str, bytes | None]]:
        """The requests to answer now (taken out of ``wanted``)."""
        by_domain: dict[str, list[bytes | None]] = {}
        for name, reply in wanted:
            by_domain.setdefault(name, []).append(reply)
        due: list[tuple[str, bytes | None]] = []
        for name, replies in sorted(by_domain.items()):
            if None in replies or len(replies) > PRIVATE_MAX:  # one answer for all
                if self._ready((name, None), now):
                    for reply in replies:
                        del wanted[name, reply]
                    due.append((name, None))
                continue
            for reply in replies:
                if self._ready((name, reply), now):
                    del wanted[name, reply]
                    due.append((name, reply))
        if len(self._resynced) > 4 * PRIVATE_MAX * max(1, len(by_domain)) + 10_000:
            cutoff = now - RESYNC_EVERY_S
            self._resynced = {k: t for k, t in self._resynced.items() if t > cutoff}
        return due

    def _ready(self, key: tuple[str, bytes | None], now: float) -> bool:
        if now - self._resynced.get(key, -RESYNC_EVERY_S) < RESYNC_EVERY_S:
            return False
        self._resynced[key] = now
        return True

    async def resync(self, name: str, reply: bytes | None = None) -> int:
        """RESYNCSTART, one DELAY_UNTIL per identifier whose verdict is still in the
        future, RESYNCDONE: on ``reply`` (a private answer, not counted in the domain's
        publish counter: nobody else receives it) or on the domain's topic. How many
        DELAY_UNTILs went."""
        engine, out = self.engine, self.out
        frame = reply or topic(name)
        sent = 0
        start = time.monotonic()
        states: list[list[tuple[bytes, State]]] = []
        counted = self.stats.domain(name)
        with contextlib.suppress(zmq.ZMQError):
            # first: listing a million states takes longer than a gatekeeper waits
            # before it asks again; the rules offer with it: a gatekeeper that asks has
            # just (re)connected, and has no first line until it hears one
            offer = self.offers.get(name)
            out.send([offer, [frame, RESYNCSTART]] if offer else [[frame, RESYNCSTART]])
            states = [await self.store.live(scope, RESYNC_MAX) for scope in engine.scopes(name)]
            now = time.time() * 1000.0
            out.begin()  # paced from here: live traffic waits only while slices wait
            try:
                for verdicts in engine.live_verdicts(name, states, now, RESYNC_SLICE):
                    send = functools.partial(_controls_from, out.pub, frame, verdicts)
                    went = await out.paced(send, len(verdicts))
                    sent += went
                    if reply is None:
                        counted.published += went  # as sent: the heartbeat's count
                    await asyncio.sleep(0)
                out.send([[frame, RESYNCDONE]])
                await out.drain()  # the deferred, RESYNCDONE among them
            finally:
                out.end()
        self.resyncs += 1
        log.info(
            "resync of %s%s: %d DELAY_UNTIL(s) from %d state(s) in %.3f s%s",
            name,
            " (private)" if reply else "",
            sent,
            sum(map(len, states)),
            time.monotonic() - start,
            f" ({out.stalled}: the rest went without waiting)" if out.stalled else "",
        )
        return sent

    async def answer_syncs(self) -> None:
        wanted = self.engine.sync_wanted
        while True:
            await _told(self._sync_asked)
            while wanted:
                reply = next(iter(wanted))
                shards = wanted.pop(reply)
                await self.sync(reply, shards)

    async def sync(self, reply: bytes, shards: frozenset[int]) -> int:
        """A peer's warm start: SYNCSTART, the states of its ``shards`` scope by scope,
        SYNCDONE with their count."""
        out, engine = self.out, self.engine
        count = 0
        start = time.monotonic()
        with contextlib.suppress(zmq.ZMQError):
            out.send([[reply, SYNCSTART]])
            out.begin()
            try:
                for scope in engine.every_scope():
                    pairs = states_of(await self.store.live(scope, RESYNC_MAX), shards)
                    messages = list(encode_states(reply, scope.key_prefix, pairs))
                    await out.paced(
                        functools.partial(_messages_from, out.pub, messages), len(messages)
                    )
                    count += len(pairs)
                out.send([[reply, SYNCDONE, b"%d" % count]])
                await out.drain()
            finally:
                out.end()
        self.syncs += 1
        log.info(
            "sync for a peer: %d state(s) of %d shard(s) in %.3f s",
            count,
            len(shards),
            time.monotonic() - start,
        )
        return count

    def merge(self, scope_prefix: bytes, pairs: list[tuple[bytes, State]]) -> int:
        """A peer's states into our store (those of a rule we have too)."""
        for scope in self.engine.every_scope():
            if scope.key_prefix == scope_prefix:
                return merge_into(self.store.table(scope), scope, pairs, time.time() * 1000.0)
        return 0


async def _told(event: asyncio.Event) -> None:
    """Until ``event`` is set (then cleared), or ``IDLE_LOOK_S`` at most."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), IDLE_LOOK_S)
    event.clear()


def _controls_from(
    pub: zmq.Socket[bytes], frame: bytes, verdicts: list[tuple[bytes, int]], rest: int
) -> int:
    """A resync's slice from its ``rest``-th DELAY_UNTIL on, until one is refused."""
    return send_controls(pub, frame, verdicts[rest:], True)


def _messages_from(pub: zmq.Socket[bytes], messages: list[list[bytes]], rest: int) -> int:
    return send_until_refused(pub, messages[rest:])
