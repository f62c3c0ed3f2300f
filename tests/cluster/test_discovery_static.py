"""Static discovery and the factory."""

from __future__ import annotations

import pytest

from smockron.cluster.discovery import make_discovery
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.discovery.static import StaticDiscovery, parse_peers
from smockron.errors import ConfigError
from tests.cluster.test_discovery_support import Recorder


async def test_static_reports_sorted_deduplicated_list_once() -> None:
    rec = Recorder()
    disc = StaticDiscovery("127.0.0.1:1052, 127.0.0.1:1051,127.0.0.1:1052")
    await disc.start(rec)
    await disc.stop()
    assert rec.lists == [[PeerInfo("127.0.0.1:1051"), PeerInfo("127.0.0.1:1052")]]


async def test_static_adds_self_when_missing() -> None:
    rec = Recorder()
    disc = StaticDiscovery(["10.0.0.2:1051"], advertise=PeerInfo("10.0.0.1:1051", "10.0.0.1:1050"))
    await disc.start(rec)
    assert rec.lists[-1] == [PeerInfo("10.0.0.1:1051", "10.0.0.1:1050"), PeerInfo("10.0.0.2:1051")]


@pytest.mark.parametrize("bad", ["127.0.0.1", "host:port", ":1051", "h:99999", ""])
def test_static_rejects_bad_addresses(bad: str) -> None:
    with pytest.raises(ValueError):
        StaticDiscovery(bad)


def test_parse_peers_ipv6() -> None:
    assert parse_peers("[::1]:1051") == [PeerInfo("[::1]:1051")]


async def test_factory_builds_static() -> None:
    rec = Recorder()
    disc = make_discovery("static", peers="127.0.0.1:1051", advertise="127.0.0.1:1051")
    await disc.start(rec)
    await disc.stop()
    assert rec.addresses == {"127.0.0.1:1051"}


def test_factory_unknown_kind() -> None:
    with pytest.raises(ConfigError, match="member-list"):
        make_discovery("member-list")


def test_factory_wraps_bad_options() -> None:
    with pytest.raises(ConfigError, match="static"):
        make_discovery("static", peers="nonsense")
