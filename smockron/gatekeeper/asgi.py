"""Pure ASGI middleware: works under Starlette, FastAPI or any ASGI server.

A delayed request waits before the app sees it, the client's connection held open,
while ``receive()`` is watched: a client that disconnects during its delay never
reaches the app, and any body that arrived meanwhile is replayed to the app. A
rejected request is answered here and never reaches the app. Non-HTTP scopes pass
straight through; a lifespan shutdown closes the gatekeeper.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Final, Unpack

from prometheus_client import REGISTRY, CollectorRegistry

from smockron.errors import ConfigError
from smockron.gatekeeper._asyncio import AsyncGatekeeper
from smockron.gatekeeper._base import GatekeeperOptions
from smockron.gatekeeper._decider import ACCEPT, DELAY, Decision, Waiting
from smockron.gatekeeper._link import now_ms
from smockron.gatekeeper.httpgate import LOGINFO_MAX, HttpGate, LogInfo, http_loginfo
from smockron.gatekeeper.identify import (
    DomainOf,
    Identify,
    RequestInfo,
    as_identifier,
    peer_address,
)
from smockron.observe.collect import register_summed
from smockron.observe.layouts import GATEKEEPER

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ASGIRequestInfo(RequestInfo):
    """The identification view of an ASGI HTTP scope, reading its raw header list.

    Headers are found by scanning the (short) list on demand: cheaper per request than
    building a closure or a dictionary, and this runs on every request.
    """

    __slots__ = ("_raw",)

    def __init__(self, scope: Scope) -> None:
        client = scope.get("client")
        super().__init__(
            client[0] if client else None, scope.get("method", "GET"), scope.get("path", "/")
        )
        self._raw: list[tuple[bytes, bytes]] = scope.get("headers") or []

    def header(self, name: str) -> str | None:
        key = name.encode("latin-1")
        values = [v for k, v in self._raw if k == key]
        if not values:
            return None
        return b", ".join(values).decode("latin-1")


def request_info(scope: Scope) -> RequestInfo:
    return ASGIRequestInfo(scope)


def scope_loginfo(scope: Scope) -> bytes:
    """:func:`http_loginfo` of an ASGI scope, the same bytes, in one scan of its headers.

    Header bytes are used as they are when ASCII (then latin-1 decoding and UTF-8
    encoding give them back unchanged); anything else takes the general path.
    """
    ua = referer = None
    for key, value in scope.get("headers") or ():
        if key == b"user-agent":
            ua = value if ua is None else ua + b", " + value
        elif key == b"referer":
            referer = value if referer is None else referer + b", " + value
    text = b"ua=" + (ua or b"-") + b" referer=" + (referer or b"-")
    if not text.isascii():
        return http_loginfo(ASGIRequestInfo(scope))
    return text[:LOGINFO_MAX]


log = logging.getLogger("smockron.gatekeeper")

MAX_REPLAY_BODY: Final = 64 * 1024
"""Body bytes a delayed request may have buffered while its disconnection is watched for.

Past this, the watch stops (the server's flow control then holds the client back) and
the rest of the delay is a plain sleep.
"""


class SmockronMiddleware:
    """Rate-limit an ASGI app through a Smockron master.

    Pass ``gatekeeper`` to share one :class:`AsyncGatekeeper` between apps (its owner
    closes it), or the master's ``accounting`` and ``control`` addresses to make one
    here, closed at lifespan shutdown.

    ``rules`` holds each identifier to its domain's rules on this gatekeeper's own traffic
    between two verdicts of the master (``{"api": ["10/s:20"]}``, the master's syntax);
    with ``master_rules`` (default) the rules the master offers replace them.

    The other keywords (``max_delay_ms``, ``max_delayed``, ``reject_sample``,
    ``max_ahead_ms``, ``curve``, ...: :class:`~smockron.gatekeeper.GatekeeperOptions`)
    configure the gatekeeper made here, with :class:`AsyncGatekeeper`'s defaults.

    ``flush_delay_ms`` (default 2) is how long accounting messages are gathered before
    one send burst: longer costs less CPU per request and tells the master later.

    ``abandoned`` counts the delayed requests whose client disconnected during their
    delay: those never reach the app.

    ``registry``: the prometheus-client registry the ``smockron_gatekeeper_*`` metrics
    are read into at scrape time (default the global one; None: no metrics). Several
    middlewares in one registry add up.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        domain: str | Mapping[str, str] | DomainOf,
        accounting: str | None = None,
        control: str | None = None,
        gatekeeper: AsyncGatekeeper | None = None,
        identify: Identify = peer_address,
        loginfo: LogInfo | None = http_loginfo,
        reject_status: int = 503,
        flush_delay_ms: float | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        **options: Unpack[GatekeeperOptions],
    ) -> None:
        self.app = app
        self.gate = HttpGate(domain, identify, loginfo, reject_status)
        self._owns_gatekeeper = gatekeeper is None  # a shared one is closed by its owner
        self.gatekeeper = gatekeeper or AsyncGatekeeper(
            accounting, control, self.gate.domains, **options
        )
        if flush_delay_ms is not None:
            if not 0 <= flush_delay_ms <= 1000:
                raise ConfigError(f"flush_delay_ms must be in [0, 1000], got {flush_delay_ms}")
            self.gatekeeper.flush_delay_s = flush_delay_ms / 1000
        self.abandoned = 0
        if registry is not None:
            register_summed(registry, GATEKEEPER, self)
        # The defaults (one fixed domain, the peer address, the seed's loginfo or none)
        # read the scope directly: no RequestInfo, one header scan. Same result as
        # HttpGate.resolve, at a fraction of its cost on every request.
        fast = (
            isinstance(domain, str)
            and domain
            and "\0" not in domain
            and identify is peer_address
            and loginfo in (http_loginfo, None)
        )
        self._fast_domain = domain.encode() if fast and isinstance(domain, str) else None
        self._fast_loginfo = loginfo is not None

    def stats(self) -> dict[str, int]:
        """The gatekeeper's counters plus this middleware's own (for logs and metrics)."""
        return {
            **self.gatekeeper.stats(),
            "fail_open_errors": self.gate.errors,
            "abandoned": self.abandoned,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                receive = self._lifespan_receive(receive)
            await self.app(scope, receive, send)
            return
        gatekeeper = self.gatekeeper
        domain = self._fast_domain
        try:
            if domain is not None:
                client = scope.get("client")
                identifier = as_identifier(client[0]) if client else None
                if identifier is None:  # no peer address: not limited, as peer_address
                    await self.app(scope, receive, send)
                    return
                loginfo = scope_loginfo(scope) if self._fast_loginfo else None
            else:
                target = self.gate.resolve(ASGIRequestInfo(scope))
                if target is None:
                    await self.app(scope, receive, send)
                    return
                domain, identifier, loginfo = target
            if not gatekeeper.started:
                gatekeeper.start()
            # no coroutine unless there is a delay to wait out
            decision = gatekeeper.check(domain, identifier, now_ms(), loginfo)
        except Exception as exc:  # fail-permissive, even against our own bugs
            self.gate.fail_open(exc)
            await self.app(scope, receive, send)
            return
        verdict = decision[0]
        if verdict is ACCEPT:
            await self.app(scope, receive, send)
        elif verdict is DELAY:
            await self._delayed(decision, (domain, identifier, loginfo), scope, receive, send)
        else:
            await self._reject(decision, scope, send)

    async def _delayed(
        self,
        decision: Decision,
        target: tuple[bytes, bytes, bytes | None],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Wait out a delay watching for the client leaving, then call the app; wait
        again while the master has moved the identifier's time on (``Decider.recheck``).
        The DELAYED accounting is sent when the request goes (``AsyncGatekeeper.check``)."""
        domain, identifier, loginfo = target
        replay: deque[Message] = deque()
        pending: asyncio.Future[Message] | None = None
        gatekeeper = self.gatekeeper
        waiting = Waiting(gatekeeper.decider, domain, identifier, decision)
        until: int | None = decision.until_ms
        gone = False
        try:
            while until is not None:
                gone, pending = await self._watch(until, receive, replay, pending)
                if gone:
                    break
                until = waiting.woke(now_ms())
        finally:
            gatekeeper.release()
        if gone:  # it never reaches the app: not accounted
            self.abandoned += 1
            log.debug("client %s left during its delay: not calling the app", scope.get("client"))
            return
        if decision.paced:
            gatekeeper.account_went(waiting, loginfo)
        if waiting.rejected:  # the wait went past the longest delay
            if pending is not None:
                pending.cancel()
            await self._reject(decision, scope, send)
            return
        await self._call_app(scope, receive, send, replay, pending)

    async def _call_app(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        replay: deque[Message],
        pending: asyncio.Future[Message] | None,
    ) -> None:
        """Call the app after a delay: it receives first what was read while waiting
        (``replay``, then the read still ``pending``), then ``receive``'s messages."""
        if not replay and pending is None:
            await self.app(scope, receive, send)
            return

        async def replaying_receive() -> Message:
            nonlocal pending
            if replay:
                return replay.popleft()
            if pending is not None:
                task, pending = pending, None
                message: Message = await task
                return message
            return await receive()

        try:
            await self.app(scope, replaying_receive, send)
        finally:
            if pending is not None:
                if not pending.done():
                    pending.cancel()  # the app is done: nothing will read that message
                elif not pending.cancelled():
                    pending.exception()  # retrieved: no "never retrieved" warning

    async def _watch(
        self,
        until_ms: int,
        receive: Receive,
        replay: deque[Message],
        pending: asyncio.Future[Message] | None = None,
    ) -> tuple[bool, asyncio.Future[Message] | None]:
        """Sleep until ``until_ms`` while reading ``receive()`` into ``replay``.

        Returns whether the client disconnected, and the ``receive()`` still in flight
        if any (the app's first read finishes it).
        """
        buffered = sum(len(message.get("body", b"")) for message in replay)
        try:
            while True:
                remaining = (until_ms - now_ms()) / 1000
                if remaining <= 0:
                    return False, pending
                if buffered > MAX_REPLAY_BODY:  # stop reading: flow control holds the client
                    await asyncio.sleep(remaining)
                    return False, pending
                if pending is None:
                    pending = asyncio.ensure_future(receive())
                done, _ = await asyncio.wait((pending,), timeout=remaining)
                if not done:
                    return False, pending
                if pending.cancelled() or pending.exception() is not None:
                    return False, pending  # the app's first receive() meets the same fate
                message = pending.result()
                pending = None
                if message.get("type") == "http.disconnect":
                    return True, None
                replay.append(message)
                buffered += len(message.get("body", b""))
        except BaseException:  # cancelled (server shutting down): leave no read behind
            if pending is not None:
                pending.cancel()
            raise

    async def _reject(self, decision: Decision, scope: Scope, send: Send) -> None:
        rejection = self.gate.reject(decision.wait_ms, ASGIRequestInfo(scope))
        await send(
            {
                "type": "http.response.start",
                "status": rejection.status,
                "headers": [(k.encode(), v.encode()) for k, v in rejection.headers],
            }
        )
        await send({"type": "http.response.body", "body": rejection.body})

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.gatekeeper.start()
            elif message["type"] == "lifespan.shutdown" and self._owns_gatekeeper:
                await self.gatekeeper.aclose()
            return message

        return wrapped
