"""The master's control PUB: live messages as ever, and resyncs as fast as the slowest
gatekeeper of their domain takes them.

A PUB drops a message for a subscriber whose queue is full, silently. For a resync that
is a loss every gatekeeper of the domain asks for again, whole: a restarted gatekeeper
that falls behind a million DELAY_UNTILs would never catch up. So while a resync runs
the socket refuses (``XPUB_NODROP``) a message that a subscriber has no room for, and
the resync waits (``RESYNC_WAIT_S``) and tries again: it goes at the pace of its
slowest gatekeeper, through the queues both sides already have (``--hwm`` here,
``CONTROL_HWM`` there, the TCP buffers between), and no further memory.

Meanwhile everything else sent on the socket (live verdicts, rules offers, publish
counters) must be refused rather than dropped too: libzmq, having dropped a message for
a full subscriber, stops matching it until it has read half its queue, so the resync's
next messages would be lost for it without a refusal. What is refused then waits here
(``deferred``, in order) and goes first, at the same pace.

A gatekeeper that takes nothing for ``RESYNC_STALL_S`` (stopped, or stuck) does not
hold up the others: from then until the resync ends the socket drops again, as it
always does for live traffic, and what that gatekeeper loses it asks for again when its
publish counter shows the loss. Nor does one that takes slowly: live verdicts are what
enforcement runs on, so none waits more than ``LIVE_WAIT_MAX_S`` for a resync; past
that the resync turns lossy the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import zmq

from smockron.wire.batchio import send_all, send_until_refused

RESYNC_WAIT_S = 0.001
"""How long a resync waits when its slowest gatekeeper is full before it tries again."""
RESYNC_STALL_S = 1.0
"""A resync stops waiting for a gatekeeper that took nothing for this long."""
LIVE_WAIT_MAX_S = 0.2
"""A resync stops waiting once a live message has waited behind it for this long."""


class ControlOut:
    """Everything the master publishes goes through :meth:`send`; a resync's messages
    through :meth:`paced`, between :meth:`begin` and :meth:`end`."""

    def __init__(self, pub: zmq.Socket[bytes]) -> None:
        self.pub = pub
        self.deferred: list[list[bytes]] = []
        """Messages refused while a resync is paced: they go first, in order."""
        self.pacing = False
        self.stalled = ""
        """Why the current resync stopped waiting, if it did."""
        self._since: float | None = None  # the last progress, once it had to wait
        self._deferred_at = 0.0  # when the oldest deferred message was refused

    def send(self, messages: list[list[bytes]]) -> None:
        """Live messages: sent at once (dropped for a full subscriber), or, while a
        resync is paced, in order behind those refused before them."""
        if not self.pacing:
            send_all(self.pub, messages)
            return
        if not self.deferred:
            messages = messages[send_until_refused(self.pub, messages) :]
            if messages:
                self._deferred_at = time.monotonic()
        self.deferred += messages

    def begin(self) -> None:
        """A resync starts: from now on the socket refuses rather than drops."""
        self.pacing, self.stalled, self._since = True, "", None
        self.pub.setsockopt(zmq.XPUB_NODROP, 1)

    def end(self) -> None:
        """The resync is over (or failed): back to dropping; what still waits goes now."""
        self._lossy()

    async def paced(self, send: Callable[[int], int], total: int) -> int:
        """``send(rest)`` sends the resync's messages from the ``rest``-th on until one
        is refused and says how many went; called, the loop turning ``RESYNC_WAIT_S``
        between tries, until what was deferred went and then all ``total``. How many
        went."""
        done = 0
        while True:
            if not self.pacing:  # stalled: drop for a full subscriber, as live traffic
                return done + send(done)
            waiting = len(self.deferred)
            if waiting:
                # (the wait is counted from the first refusal until none is left: a
                # gatekeeper that takes a few at a time does not hold live ones up longer)
                del self.deferred[: send_until_refused(self.pub, self.deferred)]
            went = 0
            if not self.deferred:  # what waited went first
                went = send(done)
                done += went
                if done >= total:
                    return done
            self._waiting(went > 0 or len(self.deferred) < waiting)
            await asyncio.sleep(RESYNC_WAIT_S)

    async def drain(self) -> int:
        """:meth:`paced` with nothing of the resync's own: what was deferred goes, at the
        same pace."""
        return await self.paced(_nothing, 0)

    def _waiting(self, progressed: bool) -> None:
        """A subscriber is full; after ``RESYNC_STALL_S`` without progress, or once a
        live message has waited ``LIVE_WAIT_MAX_S``, stop waiting."""
        now = time.monotonic()
        if self.deferred and now - self._deferred_at >= LIVE_WAIT_MAX_S:
            self.stalled = f"live messages waited {LIVE_WAIT_MAX_S:g} s behind it"
            self._lossy()
        elif progressed or self._since is None:
            self._since = now
        elif now - self._since >= RESYNC_STALL_S:
            self.stalled = f"a gatekeeper took nothing for {RESYNC_STALL_S:g} s"
            self._lossy()

    def _lossy(self) -> None:
        self.pacing = False
        self.pub.setsockopt(zmq.XPUB_NODROP, 0)
        deferred, self.deferred = self.deferred, []
        if deferred:
            send_all(self.pub, deferred)


def _nothing(rest: int) -> int:
    return 0
