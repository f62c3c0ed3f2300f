"""DNS discovery against a real UDP DNS server on a free loopback port.

The server is a small dnspython responder whose answers the test changes while the
discovery polls it; it can also answer NXDOMAIN or pure garbage.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest
from prometheus_client import CollectorRegistry

from smockron.cluster.discovery import make_discovery
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.discovery.dns import DnsDiscovery
from smockron.errors import ConfigError
from tests.cluster.test_discovery_support import Recorder

NAME = "guber.test."
ERRORS = "smockron_discovery_errors_total"


@dataclass
class Zone:
    a: list[str] = field(default_factory=list)
    aaaa: list[str] = field(default_factory=list)
    ttl: int = 30
    mode: str = "ok"  # ok | nxdomain | garbage | silent
    queries: int = 0


class DnsResponder(asyncio.DatagramProtocol):
    def __init__(self, zone: Zone) -> None:
        self.zone = zone
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        assert self.transport is not None
        self.zone.queries += 1
        if self.zone.mode == "silent":
            return
        if self.zone.mode == "garbage":
            self.transport.sendto(data[:2] + b"\x81\x80\xff\xff garbage", addr)
            return
        query = dns.message.from_wire(data)
        reply = dns.message.make_response(query)
        question = query.question[0]
        if self.zone.mode == "nxdomain" or question.name.to_text() != NAME:
            reply.set_rcode(dns.rcode.NXDOMAIN)
        else:
            ips = self.zone.a if question.rdtype == dns.rdatatype.A else self.zone.aaaa
            if ips:
                reply.answer.append(
                    dns.rrset.from_text_list(
                        question.name, self.zone.ttl, dns.rdataclass.IN, question.rdtype, ips
                    )
                )
        self.transport.sendto(reply.to_wire(), addr)


@pytest.fixture
async def zone() -> AsyncIterator[tuple[Zone, int]]:
    z = Zone(a=["10.1.0.1", "10.1.0.2"])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: DnsResponder(z), sock=sock)
    yield z, port
    transport.close()


def discovery(port: int, **kw: object) -> DnsDiscovery:
    options: dict[str, Any] = {
        "advertise": "10.1.0.1:1051",
        "nameservers": f"127.0.0.1:{port}",
        "poll_interval": 0.05,
        "timeout": 0.3,
    }
    options.update(kw)
    return DnsDiscovery("guber.test", **options)


async def test_reports_records_and_follows_changes(zone: tuple[Zone, int]) -> None:
    z, port = zone
    rec = Recorder()
    disc = discovery(port)
    await disc.start(rec)
    assert rec.lists[0] == [
        PeerInfo("10.1.0.1:1051"),  # ourselves, as advertised
        PeerInfo("10.1.0.2:1051", "10.1.0.2:1050"),
    ]
    z.a = ["10.1.0.1", "10.1.0.3"]
    z.aaaa = ["fd00::7"]
    await rec.wait_for({"10.1.0.1:1051", "10.1.0.3:1051", "[fd00::7]:1051"})
    z.a = ["10.1.0.1"]
    z.aaaa = []
    await rec.wait_for({"10.1.0.1:1051"})
    calls = len(rec.lists)
    await asyncio.sleep(0.3)  # unchanged answers do not call on_change again
    assert len(rec.lists) == calls
    await disc.stop()


@pytest.mark.parametrize("mode", ["garbage", "nxdomain", "silent"])
async def test_bad_answers_keep_last_list(zone: tuple[Zone, int], mode: str) -> None:
    z, port = zone
    rec = Recorder()
    disc = discovery(port)
    await disc.start(rec)
    before = rec.lists[-1]
    z.mode = mode
    failures = disc.failures
    for _ in range(100):
        if disc.failures >= failures + 2:
            break
        await asyncio.sleep(0.05)
    assert disc.failures >= failures + 2
    assert rec.lists[-1] == before and len(rec.lists) == 1
    counted = disc.metrics.registry.get_sample_value(ERRORS, {"mechanism": "dns"})
    assert counted == disc.failures
    z.mode = "ok"
    z.a = ["10.1.0.9"]
    await rec.wait_for({"10.1.0.1:1051", "10.1.0.9:1051"})
    await disc.stop()


async def test_peers_listen_where_we_do(zone: tuple[Zone, int]) -> None:
    """Address records carry no ports: each peer's gRPC and PeersV1 ports are ours."""
    _, port = zone
    rec = Recorder()
    me = PeerInfo("10.1.0.1:1051", peer_address="10.1.0.1:7000")
    disc = discovery(port, advertise=me)
    await disc.start(rec)
    await disc.stop()
    assert rec.lists[0] == [me, PeerInfo("10.1.0.2:1051", "10.1.0.2:1050", "", "10.1.0.2:7000")]
    assert discovery(port, advertise="10.1.0.1:1051").peer_port is None  # the caller's default


async def test_counters_are_per_instance(zone: tuple[Zone, int]) -> None:
    z, port = zone
    z.mode = "nxdomain"
    failing = discovery(port, registry=CollectorRegistry())
    await failing.start(Recorder())
    z.mode = "ok"
    working = discovery(port, registry=CollectorRegistry())
    await working.start(Recorder())
    await failing.stop()
    await working.stop()
    labels = {"mechanism": "dns"}
    assert failing.metrics.registry.get_sample_value(ERRORS, labels) == failing.failures >= 1
    assert working.metrics.registry.get_sample_value(ERRORS, labels) == working.failures == 0


async def test_dns_down_at_start_serves_alone(zone: tuple[Zone, int]) -> None:
    z, port = zone
    z.mode = "nxdomain"
    rec = Recorder()
    disc = discovery(port)
    await disc.start(rec)
    assert rec.lists == [[PeerInfo("10.1.0.1:1051")]]
    z.mode = "ok"
    await rec.wait_for({"10.1.0.1:1051", "10.1.0.2:1051"})
    await disc.stop()


async def test_interval_follows_ttl_without_fixed_interval(zone: tuple[Zone, int]) -> None:
    z, port = zone
    z.ttl = 7
    disc = DnsDiscovery("guber.test", nameservers=f"127.0.0.1:{port}", grpc_port=9000)
    assert await disc.poll() == 7.0
    z.ttl = 0
    assert await disc.poll() == 1.0  # floor: never hammer the server


async def test_factory_builds_dns(zone: tuple[Zone, int]) -> None:
    _, port = zone
    rec = Recorder()
    disc = make_discovery(
        "dns", fqdn=NAME, nameservers=f"127.0.0.1:{port}", grpc_port=81, poll_interval=1
    )
    await disc.start(rec)
    await disc.stop()
    assert rec.addresses == {"10.1.0.1:81", "10.1.0.2:81"}


def test_resolv_conf_is_read_and_a_missing_one_named(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 127.0.0.9\n")
    assert DnsDiscovery("g.test", resolv_conf=str(conf))._resolver.nameservers == ["127.0.0.9"]
    with pytest.raises(ConfigError, match=r"nope\.conf"):
        make_discovery("dns", fqdn="g.test", resolv_conf=str(tmp_path / "nope.conf"))
