"""DNS discovery: poll the A and AAAA records of one name; every address is a peer.

Like Gubernator's DNS pool, a headless Kubernetes service or any round-robin name works.
Peers are ``ip:grpc_port`` (IPv6 bracketed). Unlike Gubernator, whose ports are fixed at
1051/1050, the ports are options, and the poll interval may be fixed instead of following
the records' TTL.

Address records carry no ports, so every node behind the name is taken to listen where
this one does: its gRPC port and, when this node advertises one, its PeersV1 port
(``peer_port``). Without either, peers are called at the gRPC port + 1, or at the gRPC
port with ``peers_on_grpc_port``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import dns.asyncresolver
import dns.exception
import dns.resolver
from prometheus_client import CollectorRegistry

from smockron.cluster.discovery._common import (
    DiscoveryMetrics,
    Publisher,
    as_peer,
    cancel_task,
    join_host_port,
    log,
    split_host_port,
)
from smockron.cluster.discovery.base import DISCOVERY, OnChange, PeerInfo
from smockron.ratelog import RateLimitedLog

MAX_TTL_DELAY = 300.0
"""Gubernator polls again after the smallest record TTL, but at least every 300 s."""


@DISCOVERY.register
class DnsDiscovery:
    """Polls ``fqdn`` and reports ``ip:grpc_port`` for each A/AAAA record, plus ourselves."""

    schemes = ("dns",)

    def __init__(
        self,
        fqdn: str,
        advertise: PeerInfo | str | None = None,
        *,
        grpc_port: int | None = None,
        http_port: int = 1050,
        peer_port: int | None = None,
        nameservers: Sequence[str] | str | None = None,
        resolv_conf: str = "/etc/resolv.conf",
        poll_interval: float | None = None,
        min_interval: float = 1.0,
        timeout: float = 2.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``grpc_port`` and ``peer_port`` default to this node's own (``advertise``);
        ``registry``: where the discovery counters go (the node's)."""
        if not fqdn:
            raise ValueError("dns discovery needs an fqdn")
        self.fqdn = fqdn if fqdn.endswith(".") else fqdn + "."
        self.me = as_peer(advertise) if advertise is not None else None
        if grpc_port is None:
            grpc_port = split_host_port(self.me.grpc_address)[1] if self.me else 1051
        if peer_port is None and self.me is not None and self.me.peer_address:
            peer_port = split_host_port(self.me.peer_address)[1]
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.peer_port = peer_port
        self._poll_interval = poll_interval
        self._min_interval = min_interval
        self._resolver = self._make_resolver(nameservers, resolv_conf, timeout)
        self._publisher: Publisher | None = None
        self._task: asyncio.Task[None] | None = None
        self._rlog = RateLimitedLog(log)
        self.metrics = DiscoveryMetrics("dns", registry)
        self.polls = 0
        self.failures = 0

    @staticmethod
    def _make_resolver(
        nameservers: Sequence[str] | str | None, resolv_conf: str, timeout: float
    ) -> dns.asyncresolver.Resolver:
        if nameservers is None:
            try:
                resolver = dns.asyncresolver.Resolver(filename=resolv_conf)
            except (dns.exception.DNSException, OSError) as exc:
                raise ValueError(f"cannot use resolver config {resolv_conf!r}: {exc}") from exc
        else:
            items = [nameservers] if isinstance(nameservers, str) else list(nameservers)
            items = [n.strip() for item in items for n in item.split(",") if n.strip()]
            resolver = dns.asyncresolver.Resolver(configure=False)
            hosts, ports = zip(*(_nameserver(n) for n in items), strict=True)
            if len(set(ports)) != 1:
                raise ValueError(f"all nameservers must share one port: {items}")
            resolver.nameservers = list(hosts)
            resolver.port = ports[0]
        resolver.timeout = timeout
        resolver.lifetime = timeout
        return resolver

    async def start(self, on_change: OnChange) -> None:
        self._publisher = Publisher(on_change, self.me)
        delay = await self.poll()
        if self._publisher.current is None:
            self._publisher.publish([])  # DNS failed: serve alone until it answers
        self._task = asyncio.create_task(self._run(delay), name="dns-discovery")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_task(task)

    async def _run(self, delay: float) -> None:
        while True:
            await asyncio.sleep(delay)
            delay = await self.poll()

    async def poll(self) -> float:
        """Resolve once, publish if anything was found; returns the delay to the next poll."""
        self.polls += 1
        (v4, ttl4), (v6, ttl6) = await asyncio.gather(self._lookup("A"), self._lookup("AAAA"))
        ttl = min(ttl4, ttl6, MAX_TTL_DELAY)
        peers = [self._peer(ip) for ip in [*v4, *v6]]
        if peers and self._publisher is not None:
            self._publisher.publish(peers)
        elif not peers:
            self.failures += 1
            self.metrics.errors.inc()
            self._rlog.warning(
                "no A/AAAA records for %s; keeping peers", self.fqdn, key="dns-empty"
            )
        if self._poll_interval is not None:
            return self._poll_interval
        return max(ttl, self._min_interval)

    async def _lookup(self, rdtype: str) -> tuple[list[str], float]:
        try:
            answer = await self._resolver.resolve(self.fqdn, rdtype, search=False)
        except dns.resolver.NoAnswer:
            return [], MAX_TTL_DELAY
        except (dns.exception.DNSException, OSError) as exc:
            self._rlog.warning(
                "DNS %s lookup of %s failed: %s", rdtype, self.fqdn, exc, key=f"dns-{rdtype}"
            )
            return [], MAX_TTL_DELAY
        rrset = answer.rrset
        if rrset is None:
            return [], MAX_TTL_DELAY
        return [str(r.address) for r in rrset], float(rrset.ttl)

    def _peer(self, ip: str) -> PeerInfo:
        return PeerInfo(
            grpc_address=join_host_port(ip, self.grpc_port),
            http_address=join_host_port(ip, self.http_port),
            peer_address=join_host_port(ip, self.peer_port) if self.peer_port else "",
        )


def _nameserver(text: str) -> tuple[str, int]:
    """``1.2.3.4`` / ``1.2.3.4:5353`` / ``[::1]:5353`` -> (host, port)."""
    if text.count(":") == 1 or text.startswith("["):
        return split_host_port(text)
    return text, 53
