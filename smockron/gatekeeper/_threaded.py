"""The threaded gatekeeper, for WSGI servers and plain code."""

from __future__ import annotations

import contextlib
import threading
import time
from types import TracebackType
from typing import Any

import zmq

from smockron.gatekeeper._base import _POLL_MS, SWEEP_INTERVAL_S, _GatekeeperBase
from smockron.gatekeeper._decider import REJECT, Decision, Verdict, Waiting
from smockron.gatekeeper._link import (
    CONTROL_BATCH,
    CONTROL_BATCHES,
    CONTROL_SLICE,
    _batch_io_thread,
    now_ms,
)
from smockron.wire.codec import DEFAULT_LIMITS
from smockron.wire.control import drain_control


class Gatekeeper(_GatekeeperBase):
    """Threaded gatekeeper for WSGI servers and plain code; a daemon thread reads control."""

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        _batch_io_thread(self._ctx)  # it is woken by every accounting message sent
        self._pub = self._setup_pub(self._ctx)
        self._monitor = self._pub.get_monitor_socket(self._monitor_events) if self._pub else None
        if self._pub is not None:
            self._connect_pub(self._pub)
        self._subs: list[zmq.Socket[bytes] | None] = []  # one per master
        self._cmonitors: list[zmq.Socket[bytes]] = []
        for link, (_acc, ctl) in enumerate(self.masters):
            sub = self._ctx.socket(zmq.SUB) if ctl else None
            self._subs.append(sub)
            if sub is not None:
                self._cmonitors.append(sub.get_monitor_socket(self._monitor_events))
                self._connect_sub(sub, link)
        self._thread = threading.Thread(target=self._run, name="smockron-gatekeeper", daemon=True)
        self._thread.start()

    def decide(
        self,
        domain: bytes,
        identifier: bytes,
        now: int | None = None,
        loginfo: bytes | None = None,
        defer: bool = False,
    ) -> Decision:
        """:meth:`_GatekeeperBase.decide` under the lock shared with the socket thread."""
        with self._lock:
            return _GatekeeperBase.decide(self, domain, identifier, now, loginfo, defer)

    def release(self) -> None:
        with self._lock:
            super().release()

    def admit(self, domain: bytes, identifier: bytes, loginfo: bytes | None = None) -> Decision:
        """Decide, and sleep through a delay; the caller turns REJECT into a response."""
        with self._lock:
            decision = _GatekeeperBase.decide(self, domain, identifier, None, loginfo, True)
        if decision.verdict is not Verdict.DELAY:
            return decision
        waiting = Waiting(self.decider, domain, identifier, decision)
        until: int | None = decision.until_ms
        try:
            while until is not None:
                time.sleep(max(0, until - now_ms()) / 1000)
                with self._lock:
                    until = waiting.woke(now_ms())
        finally:
            with self._lock:
                self.decider.release()
                if decision.paced:
                    self.account_went(waiting, loginfo)
        return decision._replace(verdict=REJECT) if waiting.rejected else decision

    def _control_socket(self, link: int = 0) -> zmq.Socket[Any] | None:
        return self._subs[link] if link < len(self._subs) else None

    def _run(self) -> None:
        poller, subs, monitors = self._poller()
        next_sweep = time.monotonic() + SWEEP_INTERVAL_S
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(_POLL_MS))
            except zmq.ZMQError:
                break  # context terminated by close()
            for sock in ready:
                self._ready(sock, subs, monitors)
            with self._lock:
                self._poke()
            if time.monotonic() >= next_sweep:
                self._sweep()
                next_sweep = time.monotonic() + SWEEP_INTERVAL_S

    def _poller(
        self,
    ) -> tuple[zmq.Poller, dict[zmq.Socket[bytes], int], dict[zmq.Socket[bytes], int]]:
        """The reader's poller, and which master each control socket and monitor is of."""
        poller = zmq.Poller()
        subs: dict[zmq.Socket[bytes], int] = {}  # control socket -> its master
        monitors: dict[zmq.Socket[bytes], int] = {}  # its monitor -> the same
        cmonitors = iter(self._cmonitors)
        for link, sub in enumerate(self._subs):
            if sub is not None:
                subs[sub] = monitors[next(cmonitors)] = link
        for sock in (self._monitor, *subs, *monitors):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        return poller, subs, monitors

    def _ready(
        self,
        sock: zmq.Socket[bytes],
        subs: dict[zmq.Socket[bytes], int],
        monitors: dict[zmq.Socket[bytes], int],
    ) -> None:
        """Read one socket the poller found readable."""
        if sock is self._monitor:
            with self._lock:
                self._apply_monitor(sock.recv_multipart())
        elif sock in subs:
            self._drain_sub(sock, subs[sock])
        elif sock in monitors:
            with self._lock:
                self._apply_monitor(sock.recv_multipart(), True, monitors[sock])

    def _sweep(self) -> None:
        """Once a second: forget passed verdicts, watch the masters, give memory back."""
        with self._lock:
            self._forget_passed(now_ms())
            self._watch_master(now_ms())
        self.decider.reclaimer.reclaim()  # memory back after a wave, unlocked

    def _drain_sub(self, sub: zmq.Socket[bytes], link: int = 0) -> None:
        """Everything queued, in batches (wire.control.drain_control: one compiled call each,
        DELAY_UNTILs decoded while received), applied under the lock a slice at a time so
        requests are decided in between."""
        for _ in range(CONTROL_BATCHES):  # bounded, so sweeping and stopping still happen
            batch = drain_control(sub, CONTROL_BATCH, self._control_topics, DEFAULT_LIMITS)
            if not batch:
                return
            self.watch.heard(now_ms())
            for start in range(0, len(batch), CONTROL_SLICE):
                now = now_ms()
                with self._lock:  # the first line's times are shared with decide
                    self._apply_batch(batch[start : start + CONTROL_SLICE], now, link)

    def close(self) -> None:
        """Stop the reader thread and close the sockets."""
        self._stop.set()
        self._thread.join(2.0)
        with self._lock:
            subs = [sub for sub in self._subs if sub is not None]
            for watched in (self._pub, *subs):
                if watched is not None:
                    with contextlib.suppress(zmq.ZMQError):
                        watched.disable_monitor()
            for sock in (self._monitor, *self._cmonitors, *subs):
                if sock is not None:
                    sock.close(0)
            if self._pub is not None:  # what is queued still goes to a connected master
                self._pub.close(self._close_linger_ms())
            self._pub = None
        self._ctx.term()

    def __enter__(self) -> Gatekeeper:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
