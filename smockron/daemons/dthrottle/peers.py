"""Peer transports for DThrottle reports: UDP multicast (the seed's) and unicast.

Both are thin: they hand every datagram they receive to one handler and send the
datagrams of a report to every peer. Losing a datagram only costs accuracy, so nothing
here retries, acknowledges or blocks; send errors are logged (rate-limited) and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.dthrottle.peers")
_ratelog = RateLimitedLog(log)

DatagramHandler = Callable[[bytes, Any], None]
SEND_BUFFER = 1 << 20


class PeerTransport(Protocol):
    async def start(self, handler: DatagramHandler) -> None: ...

    def send(self, datagrams: Sequence[bytes]) -> None: ...

    def close(self) -> None: ...


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, handler: DatagramHandler) -> None:
        self._handler = handler

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self._handler(data, addr)

    def error_received(self, exc: Exception) -> None:
        # e.g. ICMP port unreachable from a peer that is down: it will catch up later
        _ratelog.warning("peer socket error (reports may be lost): %s", exc, key="udp-error")


async def _resolve(host: str, port: int) -> tuple[str, int]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM)
    address = infos[0][4]
    return str(address[0]), int(address[1])


class UnicastPeers:
    """Receive on ``bind``; send every report to each address in ``peers`` (IPv4).

    Datagrams from an IP address that is not a listed peer are dropped (and counted in
    ``strangers``): on a unicast network nobody else has a reason to report to us.
    """

    def __init__(self, bind: tuple[str, int], peers: Sequence[tuple[str, int]]) -> None:
        self.bind = bind
        self.peers = list(peers)
        self._addresses: list[tuple[str, int]] = []
        self._transport: asyncio.DatagramTransport | None = None
        self.strangers = 0

    async def start(self, handler: DatagramHandler) -> None:
        loop = asyncio.get_running_loop()
        self._addresses = [await _resolve(host, port) for host, port in self.peers]
        allowed = {host for host, _ in self._addresses}

        def from_peers_only(data: bytes, addr: Any) -> None:
            if addr[0] in allowed:
                handler(data, addr)
                return
            self.strangers += 1
            _ratelog.warning("dropped a datagram from %s: not a listed peer", addr, key="stranger")

        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            sock.bind(self.bind)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Endpoint(from_peers_only), sock=sock
        )
        self._transport = transport
        self.bind = cast(tuple[str, int], sock.getsockname())
        log.info("unicast reports on udp %s:%d to %s", *self.bind, self.peers)

    def send(self, datagrams: Sequence[bytes]) -> None:
        transport = self._transport
        if transport is None:
            return
        for address in self._addresses:
            for datagram in datagrams:
                transport.sendto(datagram, address)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None


class MulticastPeers:
    """Join ``group`` on ``interface``; reports go to the group, echoes come back to us.

    Several daemons on one host may share the group port (SO_REUSEADDR), and loopback
    delivery stays on, so the sender id in each datagram is what drops our own echo.
    """

    def __init__(self, group: str, port: int, interface: str = "0.0.0.0", ttl: int = 1) -> None:
        self.group = group
        self.port = port
        self.interface = interface
        self.ttl = ttl
        self._transport: asyncio.DatagramTransport | None = None

    def _socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            sock.bind((self.group, self.port))
            membership = socket.inet_aton(self.group) + socket.inet_aton(self.interface)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
            sock.setsockopt(
                socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(self.interface)
            )
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, self.ttl)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        return sock

    async def start(self, handler: DatagramHandler) -> None:
        loop = asyncio.get_running_loop()
        sock = self._socket()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Endpoint(handler), sock=sock)
        self._transport = transport
        log.info("multicast reports on %s:%d via %s", self.group, self.port, self.interface)

    def send(self, datagrams: Sequence[bytes]) -> None:
        if self._transport is None:
            return
        for datagram in datagrams:
            self._transport.sendto(datagram, (self.group, self.port))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
