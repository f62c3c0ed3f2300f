"""The asyncio gatekeeper: control is read by a task, delays are ``asyncio.sleep``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from types import TracebackType
from typing import Any, Final

import zmq
import zmq.asyncio

from smockron.gatekeeper._base import _POLL_MS, SWEEP_INTERVAL_S, _GatekeeperBase
from smockron.gatekeeper._decider import REJECT, Decision, Verdict, Waiting
from smockron.gatekeeper._link import CONTROL_BATCH, CONTROL_SLICE, _batch_io_thread, now_ms
from smockron.wire.batchio import Readable, send_all, wait_readable
from smockron.wire.codec import DEFAULT_LIMITS
from smockron.wire.control import drain_control

log = logging.getLogger("smockron.gatekeeper")

FLUSH_DELAY_S: Final = 0.002
"""How long the asyncio twin gathers accounting messages before one send burst."""
CLOSE_WAIT_S: Final = 2.0
"""How long :meth:`AsyncGatekeeper.aclose` waits for its cancelled tasks."""
FLUSH_BATCH: Final = 256
"""A batch this large is sent at once, without waiting for the timer."""


def _destroy(ctx: zmq.Context[zmq.Socket[bytes]], sockets: list[zmq.Socket[Any]]) -> None:
    """Close a dropped gatekeeper's sockets (no linger), then its context."""
    for sock in sockets:
        sock.close(0)
    ctx.term()


class AsyncGatekeeper(_GatekeeperBase):
    """The asyncio twin: control is read by a task, delays are ``asyncio.sleep``.

    Sockets are made in :meth:`start` (called lazily by :meth:`admit`) so they belong to
    the running loop. Everything runs on the loop's thread, so no lock is needed.
    """

    def _setup(self) -> None:
        self.flush_delay_s = FLUSH_DELAY_S  # settable: longer gathers more per wake-up
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: list[list[bytes]] = []
        self._flush_timer = False  # a _timed_flush is scheduled
        self._tasks: list[asyncio.Task[None]] = []
        self._sockets: list[zmq.Socket[Any]] = []
        self._watched: list[zmq.Socket[Any] | None] = []  # each master's control socket
        self.started = False

    def start(self) -> None:
        """Connect the sockets and start the reader tasks; idempotent."""
        if self.started:
            return
        self.started = True
        self.watch.started_ms = now_ms()  # the grace before the warning counts from here
        self._loop = asyncio.get_running_loop()
        self._ctx = ctx = zmq.Context()  # owns every socket; the asyncio ones wrap its monitors
        _batch_io_thread(ctx)
        # dropped without aclose(): the sockets and the context are closed when the
        # gatekeeper is collected. Left to the garbage collector, the context's __del__
        # ran after the weak references to its sockets were cleared, closed none, and
        # its term() hung the process waiting for them
        self._finalizer = weakref.finalize(self, _destroy, ctx, self._sockets)
        self._finalizer.atexit = False  # at exit another thread may still be using them
        self._pub = self._setup_pub(ctx)  # sync socket: NOBLOCK sends, no futures
        if self._pub is not None:
            self._sockets.append(self._pub)
            events = self._monitor_events
            monitor = zmq.asyncio.Socket.from_socket(self._pub.get_monitor_socket(events))
            self._sockets.append(monitor)
            self._tasks.append(asyncio.create_task(self._read_monitor(monitor)))
            self._tasks.append(asyncio.create_task(self._read_xpub(self._pub)))
            self._connect_pub(self._pub)
        for link, (_acc, ctl) in enumerate(self.masters):
            if not ctl:
                self._watched.append(None)
                continue
            sub = ctx.socket(zmq.SUB)  # sync socket: drained in batches, never awaited
            events = self._monitor_events
            cmonitor = zmq.asyncio.Socket.from_socket(sub.get_monitor_socket(events))
            self._connect_sub(sub, link)
            self._sockets += [sub, cmonitor]
            self._watched.append(sub)
            self._tasks.append(asyncio.create_task(self._read_control(sub, link)))
            self._tasks.append(asyncio.create_task(self._read_monitor(cmonitor, True, link)))
        self._tasks.append(asyncio.create_task(self._sweep()))

    async def admit(
        self, domain: bytes, identifier: bytes, loginfo: bytes | None = None
    ) -> Decision:
        """Decide, and wait out a delay without blocking the loop."""
        if not self.started:
            self.start()
        decision = self.decide(domain, identifier, None, loginfo, True)
        if decision.verdict is Verdict.DELAY and not await self.wait_out(
            decision, domain, identifier, loginfo
        ):
            return decision._replace(verdict=REJECT)
        return decision

    async def wait_out(
        self,
        decision: Decision,
        domain: bytes | None = None,
        identifier: bytes | None = None,
        loginfo: bytes | None = None,
    ) -> bool:
        """Sleep until a DELAY decision's time, then free its slot (also when cancelled).

        After :meth:`check` (with its domain, identifier and loginfo): wait again while
        the master has moved the identifier's time on meanwhile (:class:`Waiting`), then
        account the request; False when that went past the longest delay: the caller
        rejects the request."""
        if domain is None or identifier is None:  # nothing to recheck by
            decision = decision._replace(paced=False)
        waiting = Waiting(self.decider, domain or b"", identifier or b"", decision)
        until: int | None = decision.until_ms
        try:
            while until is not None:
                await asyncio.sleep(max(0, until - now_ms()) / 1000)
                until = waiting.woke(now_ms())
        finally:
            self.decider.release()
        if decision.paced:
            self.account_went(waiting, loginfo)
        return not waiting.rejected

    def _emit(self, pub: zmq.Socket[bytes], frames: list[bytes]) -> None:
        """Queue the message; :meth:`flush` sends the batch within ``flush_delay_s``.

        Each message sent alone wakes ZeroMQ's I/O thread (a mailbox signal, an epoll
        wake-up, a TCP write): under HTTP load that cost more CPU than everything else
        the middleware does. Gathering for 2 ms (or ``FLUSH_BATCH`` messages) shares one
        wake-up among all the requests decided meanwhile; the master learns of them 2 ms
        later, which moves no DELAY_UNTIL by more than that.
        """
        batch = self._batch
        batch.append(frames)
        if len(batch) >= FLUSH_BATCH:
            self.flush()
        elif not self._flush_timer and self._loop is not None:
            # one timer at a time: a batch flushed early leaves it armed for the next
            self._flush_timer = True
            self._loop.call_later(self.flush_delay_s, self._timed_flush)

    def _timed_flush(self) -> None:
        self._flush_timer = False
        self.flush()

    def flush(self) -> None:
        """Send every queued accounting message."""
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        pub = self._pub
        if pub is None:
            self.counters.accounting_dropped += len(batch)
            return
        try:
            sent = send_all(pub, batch)  # one compiled call for the whole batch
        except zmq.ZMQError as exc:  # closed under us: the rest of the batch is lost
            sent = getattr(exc, "sent", 0)
        dropped = len(batch) - sent
        counters = self.counters
        counters.accounting_sent += sent
        counters.accounting_dropped += dropped

    def _control_socket(self, link: int = 0) -> zmq.Socket[Any] | None:
        return self._watched[link] if link < len(self._watched) else None

    async def _read_control(self, sub: zmq.Socket[bytes], link: int = 0) -> None:
        """Control messages in batches (one compiled call each), so a gatekeeper keeps
        up with a master publishing at full rate; the loop runs requests in between."""
        readable = Readable(sub, asyncio.get_running_loop())  # a wait after each batch
        try:
            while True:
                batch = drain_control(sub, CONTROL_BATCH, self._control_topics, DEFAULT_LIMITS)
                if not batch:
                    await readable.wait(0.25)
                    continue
                self.watch.heard(now_ms())
                for start in range(0, len(batch), CONTROL_SLICE):
                    self._apply_batch(batch[start : start + CONTROL_SLICE], now_ms(), link)
                    await asyncio.sleep(0)
        finally:
            readable.close()

    async def _read_xpub(self, pub: zmq.Socket[bytes]) -> None:
        """The masters' subscriptions, as they come: a connection counts for sending
        once its master's is there (``_link._Link._awaiting``)."""
        while True:
            await wait_readable(pub, 0.25)
            self._read_subscriptions()

    async def _read_monitor(
        self, monitor: zmq.asyncio.Socket, control: bool = False, link: int = 0
    ) -> None:
        while True:
            self._apply_monitor(await monitor.recv_multipart(), control, link)
            self._send_resyncs()  # (re)connected: ask now, not at the next sweep tick

    async def _sweep(self) -> None:
        next_sweep = time.monotonic() + SWEEP_INTERVAL_S
        while True:
            await asyncio.sleep(_POLL_MS / 1000)
            self._poke()
            if time.monotonic() >= next_sweep:
                self._forget_passed(now_ms())
                self._watch_master(now_ms())
                self.decider.reclaimer.reclaim()  # memory back after a wave
                next_sweep = time.monotonic() + SWEEP_INTERVAL_S

    async def aclose(self) -> None:
        """Send what is queued, cancel the reader tasks and close the sockets.

        Never hangs: the tasks get ``CLOSE_WAIT_S`` to end (a task that does not is
        logged and left), and the sockets are closed even when this is cancelled, which
        it passes on."""
        self.flush()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        try:
            if tasks:
                done, pending = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
                for task in done:
                    error = None if task.cancelled() else task.exception()
                    if error is not None and not isinstance(error, zmq.ZMQError):
                        log.warning("gatekeeper task %s failed: %r", task.get_name(), error)
                if pending:
                    log.warning(
                        "%d gatekeeper task(s) did not stop within %.0f s of "
                        "aclose(): closing their sockets",
                        len(pending),
                        CLOSE_WAIT_S,
                    )
        finally:
            self._close_sockets()

    def _close_sockets(self) -> None:
        for watched in (self._pub, *self._watched):
            if watched is not None:
                with contextlib.suppress(zmq.ZMQError):
                    watched.disable_monitor()
        linger = self._close_linger_ms()
        for sock in reversed(self._sockets):  # what is queued still goes to a master
            sock.close(linger if sock is self._pub else 0)
        self._sockets.clear()
        self._pub = None
        if self._ctx is not None:
            self._finalizer.detach()
            self._ctx.term()
            self._ctx = None

    async def __aenter__(self) -> AsyncGatekeeper:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
