"""Who may call PeersV1 on the peer listener: the other members discovery knows.

A PeersV1 call sets state (GetPeerRateLimits charges hits as the owner, UpdatePeerGlobals
overwrites GLOBAL answers), so the peer listener takes it only from an address of a
member: the host of a member's gRPC address or PeersV1 address in the current peer list,
this node's own left out (a node never calls itself; another process on this host is not
a member unless a member runs here too). Host names are resolved when the peer list
changes, and again at most every ``RESOLVE_EVERY_S`` while calls come from an address
not in the list. A refused call ends with PERMISSION_DENIED, is counted by method and
logged (rate-limited, the address escaped). LiveCheck and HealthCheck stay open (they
change nothing).

Gubernator serves PeersV1 on its gRPC port and checks nothing beyond TLS. The address
check is the floor; with TLS, ``peer_tls_names`` (tls.peer_names_check) checks who
holds the certificate.
"""

from __future__ import annotations

import inspect
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import grpc
from prometheus_client import Counter

from smockron.cluster.node import Node
from smockron.cluster.san import IP
from smockron.cluster.transports.threaded import AdaptedHandler
from smockron.errors import ConfigError
from smockron.ratelog import RateLimitedLog, escaped
from smockron.settings import WILDCARD_HOSTS, parse_host_port

log = logging.getLogger("smockron.cluster")


RESOLVE_EVERY_S = 10.0
"""Member host names are resolved again at most this often (on a refused call)."""

REFUSED = "PeersV1 is served to the cluster's members only"


def peer_ip(peer: str) -> IP | None:
    """The address of gRPC's ``context.peer()`` (``ipv4:10.0.0.5:4242``,
    ``ipv6:%5B::1%5D:4242``); None for anything else (a Unix socket)."""
    kind, _, rest = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    return _ip(rest.rpartition(":")[0].strip("[]"))


def _ip(text: str) -> IP | None:
    try:
        address = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _host(address: str) -> str:
    """The host of a peer list address (discovery checked it: settings.parse_host_port)."""
    try:
        return parse_host_port(address)[0]
    except ConfigError:
        return ""  # not an address: no member there


class MemberGate:
    """The peer listener's address check over ``node``'s current peer list."""

    def __init__(
        self,
        node: Node,
        refused: Counter,
        resolve: Callable[[str], list[str]] | None = None,
    ) -> None:
        self._node = node
        self._refused = refused
        self._resolve = resolve or _resolve
        self._log = RateLimitedLog(log)
        self._seen: object = None  # the peer_infos the set was computed from
        self._allowed: frozenset[IP] = frozenset()
        self._names = False  # some member is named (not an IP): worth resolving again
        self._resolved_at = 0.0
        self._lock = threading.Lock()
        self._passed: dict[str, None] = {}  # peer strings let in, for _passed_for
        self._local = False
        self._passed_for: frozenset[IP] | None = None

    def allowed(self) -> frozenset[IP]:
        """The members' addresses (recomputed when discovery changed the list)."""
        if self._node.peer_infos is not self._seen:
            self._refresh()
        return self._allowed

    def _refresh(self) -> None:
        with self._lock:
            infos = self._node.peer_infos
            own = self._node.address
            hosts = {
                _host(address)
                for addr, info in infos.items()
                if addr != own
                for address in (addr, info.peer_address)
                if address
            }
            found: set[IP] = set()
            named = False
            for host in hosts - WILDCARD_HOSTS:
                ip = _ip(host)
                if ip is not None:
                    found.add(ip)
                    continue
                named = True
                found.update(a for a in map(_ip, self._resolve(host)) if a is not None)
            self._allowed, self._names = frozenset(found), named
            # a member on a loopback address is a process on this host, and a call from
            # this host comes from whichever loopback address the kernel picks for it
            self._local = any(ip.is_loopback for ip in found)
            self._seen, self._resolved_at = infos, time.monotonic()

    def refuses(self, peer: str) -> bool:
        """Is a call from ``peer`` (``context.peer()``) refused? (``deny`` counts it.)
        A connection's peer string is let in once parsed: later calls on it (the hot
        path of forwarding) cost a dict lookup, until the member list changes."""
        allowed = self.allowed()
        if self._passed_for is not allowed:
            self._passed, self._passed_for = {}, allowed
        if peer in self._passed:
            return False
        ip = peer_ip(peer)
        if ip is not None and (ip in allowed or (ip.is_loopback and self._local)):
            if len(self._passed) < 4096:  # one entry a connection
                self._passed[peer] = None
            return False
        if (
            ip is not None
            and self._names
            and time.monotonic() - self._resolved_at >= RESOLVE_EVERY_S
        ):
            self._refresh()  # a member's name may point somewhere new
            if ip in self._allowed:
                return False
        return True

    def guard(self, inner: grpc.GenericRpcHandler[Any, Any]) -> grpc.GenericRpcHandler[Any, Any]:
        """``inner`` (PeersV1's handler) with every method refusing non-members."""

        def adapt(method: str, handler: Any) -> Any:
            if handler.unary_unary is None:
                return handler
            return handler._replace(unary_unary=_wrap(method, handler.unary_unary, self))

        return AdaptedHandler(inner, adapt)

    def deny(self, method: str, peer: str) -> None:
        self._refused.labels(method.rpartition("/")[2]).inc()
        self._log.warning(
            "PeersV1 %s from %s refused: not a member of the peer list",
            method.rpartition("/")[2],
            escaped(peer),
        )


def _resolve(host: str) -> list[str]:
    try:
        return [
            str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        ]
    except OSError as exc:
        log.warning("peer %s does not resolve (%s): calls from it are refused", host, exc)
        return []


def _wrap(method: str, behavior: Callable[..., Any], gate: MemberGate) -> Callable[..., Any]:
    """``behavior`` refusing non-members first; a coroutine stays a coroutine (the
    threaded and native servers bridge those to the loop)."""
    if inspect.iscoroutinefunction(behavior):

        async def call_async(request: Any, context: Any) -> Any:
            peer = context.peer()
            if gate.refuses(peer):
                gate.deny(method, peer)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, REFUSED)
            return await behavior(request, context)

        return call_async

    def call(request: Any, context: Any) -> Any:
        peer = context.peer()
        if gate.refuses(peer):
            gate.deny(method, peer)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, REFUSED)  # raises
        return behavior(request, context)

    return call
