"""A gatekeeper's connections to its masters.

The sockets (a PUB connected to the masters' accounting addresses, a SUB to each one's
control address), their monitors (connected, disconnected, a failed CURVE handshake and
the redial after it) and the readiness they give. What comes over the control sockets is
handled in :mod:`smockron.gatekeeper._control`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterable
from typing import Any, Final

import zmq
from zmq.utils.monitor import parse_monitor_message

from smockron.curve import (
    HANDSHAKE_FAILED,
    REDIAL_S,
    CurveClient,
    allow_ipv6,
    keep_alive,
    tcp_keepalive,
)
from smockron.errors import ConfigError
from smockron.gatekeeper._control import _ControlMessages
from smockron.observe.heard import MasterWatch
from smockron.ratelog import RateLimitedLog
from smockron.settings import parse_master
from smockron.wire.codec import RULES_TOPIC, topic

log = logging.getLogger("smockron.gatekeeper")

CONTROL_BATCH: Final = 4096
"""Control messages drained in one call."""
CONTROL_SLICE: Final = 256
"""...and applied between two turns of the loop (or lock hand-overs)."""
CONTROL_HWM: Final = 100_000
"""Control messages queued for the gatekeeper before ZeroMQ drops (the master's HWM too)."""
CONTROL_RCVBUF: Final = -1
"""The control connection's kernel receive buffer in bytes; -1: the system's (autotuned).
Tests set it small so that what a stalled gatekeeper cannot hold is dropped for sure."""
CONTROL_BATCHES: Final = 64
"""Batches the threaded reader drains before it sweeps and checks for stop."""
_MONITOR_EVENTS: Final = (
    zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED
)
"""A connection counts (and is logged) once its handshake succeeded: a TCP connection
whose handshake fails (no keys here, a wrong key) is not a connection to the master."""
UNPROVEN_S: Final = 0.5
"""libzmq reports no handshake with a peer speaking ZMTP 1.0/2.0 (ZeroMQ 2 and 3, as an
original Smockron master may): without CURVE, a connection that has not failed this long
after it opened counts too. With CURVE only a succeeded handshake counts."""
AUTH_STALE_S: Final = 10.0
"""A failed handshake makes the gatekeeper not ready until one succeeds, or for this long
after the last failure (the master may have gone away meanwhile: then the silence says so)."""
_MECHANISM_MISMATCH: Final = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
CLOSE_LINGER_MS: Final = 1000
"""At close, the accounting still queued gets this long to reach a connected master
(with none connected it is dropped at once, as it would be counted had it been sent)."""
EARLY_SUBSCRIPTION_S: Final = 1.0
"""A master's subscription read before its connection's handshake event counts for the
handshakes that follow within this long."""
_SUBSCRIPTIONS_READ: Final = 1024
"""Subscription messages read from the accounting socket in one call."""
_ENDPOINT: Final = re.compile(r"^(tcp|ipc|inproc|pgm|epgm|ws|wss|vmci)://\S+$")


def _batch_io_thread(ctx: zmq.Context[Any]) -> None:
    """Run the context's I/O thread (not yet started) under ``SCHED_BATCH`` where there is one.

    libzmq flushes its pipe to the I/O thread after every message, waking that thread
    whenever it has drained the pipe; a normal thread woken on the core of a busy event
    loop (or request thread) preempts it, so each accounting message cost a context
    switch pair and the I/O thread's work was done one message at a time. A batch thread
    does not preempt on wake-up: sharing a core, it runs at the next tick or sleep,
    draining many messages at once; on an idle core it runs at once, as before. Best
    effort: without it the gatekeeper works the same, only at a higher cost.
    """
    policy = getattr(os, "SCHED_BATCH", None)
    option = getattr(zmq, "THREAD_SCHED_POLICY", None)
    if policy is None or option is None:
        return
    with contextlib.suppress(zmq.ZMQError):
        ctx.set(option, policy)


def now_ms() -> int:
    """Wall-clock milliseconds since 1970: the protocol's time base."""
    return time.time_ns() // 1_000_000


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


Master = tuple[str | None, str | None]
"""A master's accounting and control addresses."""


class _Link(_ControlMessages):
    """The connections of a gatekeeper (``_base._GatekeeperBase``) to its masters; what
    comes over the control ones is :class:`~smockron.gatekeeper._control._ControlMessages`.

    With several masters (a fleet), one PUB is connected to every master's accounting
    address and each message goes on its identifier's shard topic: ZeroMQ's subscription
    filtering hands it to the masters that hold the shard. Each master's control comes
    on a SUB of its own (a :class:`~smockron.gatekeeper._control._Control` each), so what
    it published, what we lost of it and its RESYNC answers are counted per master; a
    verdict from any of them is obeyed (the delay table keeps the latest time)."""

    sndhwm: int

    def _init_link(
        self,
        accounting: str | None,
        control: str | None,
        domains: Iterable[bytes | str] | None,
        curve: CurveClient | None,
        masters: Iterable[Master | str] = (),
    ) -> None:
        fleet = [parse_master(m) if isinstance(m, str) else m for m in masters]
        self.masters: list[Master] = fleet or [(accounting, control)]
        for acc, ctl in self.masters:
            for name, address in (("accounting", acc), ("control", ctl)):
                if address and _ENDPOINT.match(address) is None:
                    raise ConfigError(
                        f"bad {name} address {address!r}: expected a ZeroMQ endpoint such as "
                        "tcp://127.0.0.1:10004"
                    )
        self.accounting, self.control = self.masters[0]
        self.sharded = len(self.masters) > 1
        """A fleet: accounting goes on shard topics (smockron.core.shards)."""
        self.curve = curve
        self._monitor_events = _MONITOR_EVENTS
        # None: subscribe to every domain (used when the domain comes from a callable)
        self.domains = None if domains is None else frozenset(_as_bytes(d) for d in domains)
        self._init_control()
        self._peers = 0  # accounting connections up, from the PUB socket's monitor
        self._acc_up = [0] * len(self.masters)  # ...per master, handshake done
        self._awaiting: set[int] = set()
        """Masters whose accounting handshake succeeded and whose subscription has not
        arrived yet: a PUB drops what no one subscribes to, silently, so what is sent
        meanwhile would vanish; it is counted as dropped instead."""
        self._subscribed_early = 0.0  # when a subscription came before its handshake event
        self._unproven: dict[tuple[bool, int], float] = {}
        """(control?, master) -> when its TCP connection opened, handshake not yet done."""
        self._auth: dict[tuple[bool, int], tuple[int, int, float]] = {}
        """(control?, master) -> the last failed handshake (event, value, monotonic time),
        until one succeeds."""
        self._control_peers = 0  # control connections up, from the SUB socket's monitor
        self._pub: zmq.Socket[bytes] | None = None
        self._malformed_log = RateLimitedLog(log)
        self._handshake_log = RateLimitedLog(log, interval=60.0)
        self._redial: dict[tuple[bool, int], float] = {}
        """(control?, master) -> when to dial it again (monotonic)."""
        self.handshakes_failed = 0
        self.watch = MasterWatch(control, now_ms())  # readiness, and the silent-master warning

    @property
    def control_connected(self) -> bool:
        """Whether the control socket is connected: verdicts can reach this gatekeeper."""
        return self._control_peers > 0

    def master_problem(self, now: int | None = None) -> str | None:
        """Why this gatekeeper does not hear from its master, or None (readiness)."""
        return self.auth_problem() or self.watch.problem(
            now_ms() if now is None else now, self.control_connected
        )

    def auth_problem(self) -> str | None:
        """Why this gatekeeper cannot authenticate to a master (its last handshake failed
        and none succeeded since), or None."""
        now = time.monotonic()
        for (control, link), (event, value, when) in sorted(self._auth.items()):
            up = self._controls[link].up if control else self._acc_up[link]
            if up or now - when > AUTH_STALE_S:
                continue
            acc, ctl = self.masters[link]
            return (
                f"cannot authenticate to the master at {ctl if control else acc}: "
                f"{self._auth_reason(event, value)}"
            )
        return None

    def _auth_reason(self, event: int, value: int) -> str:
        """What a failed handshake's monitor event tells of its cause."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (
                f"the master refused this gatekeeper's key (ZAP status {value}): add "
                "its public key to the master's --curve-clients directory and send the "
                "master SIGHUP"
            )
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MECHANISM_MISMATCH:
            if self.curve is None:
                return (
                    "the master requires CURVE and this gatekeeper has no keys: give it "
                    "--curve-secret and --curve-server"
                )
            return (
                "this gatekeeper uses CURVE and the master does not: give the master "
                "--curve-secret and --curve-clients, or this gatekeeper no keys"
            )
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return (
                f"ZeroMQ protocol error {value:#x} in the handshake: is a smockron "
                "master listening there?"
            )
        if self.curve is not None:
            return (
                "the master closed the connection during the CURVE handshake: the key "
                "pinned with --curve-server is not the key of the master at that "
                "address (or that is not a CURVE master)"
            )
        return (
            "the master closed the connection during the handshake: it likely requires "
            "CURVE and this gatekeeper has no keys (give it --curve-secret and "
            "--curve-server), or that is no ZeroMQ master"
        )

    def _watch_master(self, now: int) -> None:
        """One loud line when the master stays silent (then again at most every minute);
        a failed authentication has its own (:meth:`_handshake_failed`)."""
        if self.auth_problem() is not None:
            return
        message = self.watch.warning(now, self.control_connected)
        if message is not None:
            log.warning("%s", message)

    @property
    def master_connected(self) -> bool:
        """Whether the accounting socket currently has a connection to a master."""
        return self._peers > 0

    def _apply_monitor(self, frames: list[bytes], control: bool = False, link: int = 0) -> None:
        """A connection event of the accounting socket, or (``control``) of master
        ``link``'s control one. A connection counts once its handshake succeeded
        (``UNPROVEN_S``): one whose handshake fails is neither counted nor logged."""
        try:
            message = parse_monitor_message(frames)
            event, value = message["event"], int(message["value"])
        except Exception:  # monitor frames come from libzmq, but never let them kill us
            return
        if not control:  # one PUB for every master: the event names the endpoint
            link = self._accounting_index(message.get("endpoint"))
        key = (control, link)
        if event & HANDSHAKE_FAILED:
            self._unproven.pop(key, None)
            self._handshake_failed(control, link, event, value)
        elif event == zmq.EVENT_CONNECTED:
            self._unproven[key] = time.monotonic()
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if self._unproven.pop(key, None) is not None or self.curve is not None:
                self._connection_up(control, link)
        elif event == zmq.EVENT_DISCONNECTED and self._unproven.pop(key, None) is None:
            self._connection_down(control, link)  # (one that never counted: not logged)

    def _prove_connections(self) -> None:
        """Without CURVE, count the connections open ``UNPROVEN_S`` with no failure
        (a ZMTP 1.0/2.0 master reports no handshake)."""
        if self.curve is not None:
            return
        now = time.monotonic()
        for key, opened in list(self._unproven.items()):
            if now - opened >= UNPROVEN_S:
                del self._unproven[key]
                self._connection_up(*key)

    def _connection_up(self, control: bool, link: int) -> None:
        self._auth.pop((control, link), None)
        if control:
            self._control_event(zmq.EVENT_CONNECTED, link)
            return
        self._acc_up[link] += 1
        # not used up by the first connection: two masters' subscriptions may arrive
        # together, before either handshake event (then the second master was never
        # counted, and its peer's death read as the last master's)
        if time.monotonic() - self._subscribed_early <= EARLY_SUBSCRIPTION_S:
            self._accounting_ready(link)
        else:  # sent to once its master's subscription arrived (_apply_subscriptions)
            self._awaiting.add(link)

    def _accounting_ready(self, link: int) -> None:
        self._peers += 1
        log.info("accounting connected to %s", self.masters[link][0])

    def _read_subscriptions(self) -> None:
        """Read the masters' subscriptions off the accounting socket (an XPUB)."""
        pub = self._pub
        if pub is None:
            return
        messages: list[bytes] = []
        with contextlib.suppress(zmq.ZMQError):
            while len(messages) < _SUBSCRIPTIONS_READ:
                messages.append(pub.recv(zmq.NOBLOCK))
        if any(m[:1] == b"\x01" for m in messages):
            self._apply_subscriptions()

    def _apply_subscriptions(self) -> None:
        """A master subscribed: the connections waiting for it count from now on, and
        those whose handshake event comes within ``EARLY_SUBSCRIPTION_S`` (which
        master's subscription it is the socket does not say: one read may hold those of
        a connection counted now and of one whose event is still to come)."""
        self._subscribed_early = time.monotonic()
        for link in sorted(self._awaiting):
            self._accounting_ready(link)
        self._awaiting.clear()

    def _connection_down(self, control: bool, link: int) -> None:
        if control:
            if self._controls[link].up:
                self._control_event(zmq.EVENT_DISCONNECTED, link)
            return
        if not self._acc_up[link]:
            return
        self._acc_up[link] -= 1
        if link in self._awaiting:  # never counted as connected: not logged either
            self._awaiting.discard(link)
            return
        self._peers = max(0, self._peers - 1)
        acc = self.masters[link][0]
        if self._peers:
            log.warning("accounting disconnected from %s: the other masters hold its share", acc)
        else:
            log.warning("accounting disconnected from %s: failing open", acc)

    def _control_event(self, event: int, link: int) -> None:
        control = self._controls[link]
        if event == zmq.EVENT_CONNECTED:
            control.up += 1
            self._control_peers += 1
            self.watch.heard(now_ms())
            log.info("control connected to %s", control.address)
            control.heartbeat.clear()  # (re)connected: what we missed is unknown...
            self._want_resync(self.domains or (), link)  # ...so ask for every live verdict
        elif event == zmq.EVENT_DISCONNECTED:
            control.up = max(0, control.up - 1)
            self._control_peers = max(0, self._control_peers - 1)
            log.warning(
                "control disconnected from %s: no verdicts from that master until it is back",
                control.address,
            )

    def _accounting_index(self, endpoint: object) -> int:
        """Which master an accounting socket event is about (by its endpoint)."""
        name = endpoint.decode("utf-8", "replace") if isinstance(endpoint, bytes) else endpoint
        for k, (acc, _ctl) in enumerate(self.masters):
            if acc == name:
                return k
        return 0

    def _handshake_failed(self, control: bool, link: int, event: int, value: int) -> None:
        """Counted, remembered (readiness) and said: one warning per master and minute,
        however fast libzmq redials."""
        self.handshakes_failed += 1
        self._auth[control, link] = (event, value, time.monotonic())
        acc, ctl = self.masters[link]
        self._handshake_log.warning(
            "cannot authenticate to the master at %s: %s; failing open meanwhile",
            ctl if control else acc,
            self._auth_reason(event, value),
            key=f"auth{link}",
        )
        self._redial.setdefault((control, link), time.monotonic() + REDIAL_S)

    def _control_socket(self, link: int = 0) -> zmq.Socket[Any] | None:
        """Subclass hook: master ``link``'s control SUB socket, once made."""
        return None

    def _dial_again(self) -> None:
        """Reconnect the sockets whose handshake failed ``REDIAL_S`` ago."""
        now = time.monotonic()
        for (control, link), due in list(self._redial.items()):
            if due > now:
                continue
            del self._redial[control, link]
            sock = self._control_socket(link) if control else self._pub
            acc, ctl = self.masters[link]
            endpoint = ctl if control else acc
            if sock is None or not endpoint:
                continue
            with contextlib.suppress(zmq.ZMQError):
                sock.disconnect(endpoint)
            with contextlib.suppress(zmq.ZMQError):
                sock.connect(endpoint)

    def _poke(self) -> None:
        """Let the accounting socket process its pending commands (new subscriptions
        among them) and read the subscriptions.

        libzmq processes a socket's commands only when its own thread calls into it, and
        sends do so throttled; a periodic call keeps a quiet gatekeeper's view of the
        master's subscription fresh, and a connection counts for sending once it is
        there (``_awaiting``). Sockets whose handshake failed are dialled again.
        """
        if self._redial:
            self._dial_again()
        if self._unproven:
            self._prove_connections()
        self._read_subscriptions()  # also lets the socket process its pending commands
        self._send_resyncs()

    def _topics(self, link: int = 0) -> list[bytes]:
        if self.domains is None:
            return [b""]
        # the rules topic also carries the master's publish counters (loss detection)
        return [
            *(topic(d) for d in sorted(self.domains)),
            RULES_TOPIC,
            *self._controls[link].replies,
        ]

    def _setup_pub(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes] | None:
        if not self.accounting:
            return None
        # an XPUB, sending as a PUB does: it also tells when a master's subscription
        # arrived, before which what is sent would be dropped silently (_awaiting)
        pub = self._secure(ctx.socket(zmq.XPUB))
        pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every master's subscription, not the first
        allow_ipv6(pub, *(acc for acc, _ctl in self.masters if acc))
        keep_alive(pub, ttl=False)  # a partitioned master is seen; no TTL: see tcp_keepalive
        if self.sharded:  # nothing queued for a master that is down: the others take it
            pub.setsockopt(zmq.IMMEDIATE, 1)
        pub.setsockopt(zmq.SNDHWM, self.sndhwm)
        # at the high-water mark a send fails (counted as accounting_dropped) instead of
        # being dropped silently by the PUB socket
        pub.setsockopt(zmq.XPUB_NODROP, 1)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.RECONNECT_IVL, 100)
        pub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        return pub  # connected by the caller once its monitor is watching (_connect_pub)

    def _close_linger_ms(self) -> int:
        """How long closing the accounting socket waits for what is queued
        (``CLOSE_LINGER_MS``): only while a master is connected to take it."""
        return CLOSE_LINGER_MS if self._peers > 0 else 0

    def _connect_pub(self, pub: zmq.Socket[bytes]) -> None:
        """Connect the accounting PUB to every master."""
        for acc, _ctl in self.masters:
            if acc:
                pub.connect(acc)

    def _secure(self, sock: zmq.Socket[Any]) -> zmq.Socket[Any]:
        """CURVE on a socket before it connects, when configured (the one place)."""
        if self.curve is not None:
            self.curve.secure(sock)
        return sock

    def _connect_sub(self, sub: zmq.Socket[Any], link: int = 0) -> None:
        """Subscribe master ``link``'s control socket (either twin's) and connect it."""
        address = self.masters[link][1] or ""
        self._secure(sub)
        allow_ipv6(sub, address)
        tcp_keepalive(sub)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, CONTROL_HWM)  # a burst of verdicts waits, not dropped
        sub.setsockopt(zmq.RCVBUF, CONTROL_RCVBUF)
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        for t in self._topics(link):
            sub.setsockopt(zmq.SUBSCRIBE, t)
        sub.connect(address)
