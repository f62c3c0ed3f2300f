"""Static discovery and the factory."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from smockron.cluster.build import build_config, build_discovery
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery import make_discovery, options_from_env
from smockron.cluster.discovery.base import Discovery, PeerInfo
from smockron.cluster.discovery.dns import DnsDiscovery
from smockron.cluster.discovery.etcd import EtcdDiscovery
from smockron.cluster.discovery.kubernetes import KubernetesDiscovery
from smockron.cluster.discovery.static import StaticDiscovery, parse_peers
from smockron.cluster.node import Node
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


ME = PeerInfo("10.0.0.1:1051", "10.0.0.1:1050", "dc1")


def test_env_etcd_maps_gubernator_variables() -> None:
    env = {
        "GUBER_PEER_DISCOVERY_TYPE": "etcd",
        "GUBER_ETCD_ENDPOINTS": "10.9.0.1:2379,10.9.0.2:2379",
        "GUBER_ETCD_KEY_PREFIX": "/rl-peers/",
        "GUBER_ETCD_ADVERTISE_ADDRESS": "10.0.0.99:1051",
    }
    found = options_from_env(env, ME)
    assert found is not None
    kind, options = found
    assert kind == "etcd"
    assert options["advertise"] == PeerInfo("10.0.0.99:1051", "10.0.0.1:1050", "dc1")
    disc = make_discovery(kind, **options)
    assert isinstance(disc, EtcdDiscovery)
    assert disc.key == "/rl-peers/10.0.0.1:1050"  # Gubernator keys by the HTTP address


def test_env_dns_and_k8s() -> None:
    found = options_from_env({"GUBER_PEER_DISCOVERY_TYPE": "dns", "GUBER_DNS_FQDN": "g.svc"}, ME)
    assert found is not None and found[1]["fqdn"] == "g.svc"
    k8s = {
        "GUBER_PEER_DISCOVERY_TYPE": "k8s",
        "GUBER_K8S_ENDPOINTS_SELECTOR": "app=gubernator",
        "GUBER_K8S_POD_IP": "10.4.0.2",
        "GUBER_K8S_POD_PORT": "81",
    }
    found = options_from_env(k8s, ME)
    assert found == (
        "k8s",
        {
            "namespace": "default",
            "selector": "app=gubernator",
            "pod_ip": "10.4.0.2",
            "pod_port": 81,
        },
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GUBER_PEER_DISCOVERY_TYPE": "dns"}, "GUBER_DNS_FQDN"),
        ({"GUBER_PEER_DISCOVERY_TYPE": "k8s"}, "GUBER_K8S_SERVICE_NAME"),
        (
            {
                "GUBER_PEER_DISCOVERY_TYPE": "k8s",
                "GUBER_K8S_ENDPOINTS_SELECTOR": "a=b",
                "GUBER_K8S_WATCH_MECHANISM": "pods",
            },
            "endpointslices",
        ),
    ],
)
def test_env_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        options_from_env(env, ME)


def test_env_none() -> None:
    assert options_from_env({}, ME) is None
    assert options_from_env({"GUBER_PEER_DISCOVERY_TYPE": "none"}, ME) is None


def test_every_mechanism_satisfies_the_protocol() -> None:
    """Typed assignments: mypy checks each class against the Discovery protocol."""
    mechanisms: list[Discovery] = [
        StaticDiscovery("127.0.0.1:1051"),
        EtcdDiscovery("127.0.0.1:1051", "127.0.0.1:2379"),
        DnsDiscovery("g.test", "127.0.0.1:1051", nameservers="127.0.0.1:5353"),
        KubernetesDiscovery(service_name="g", pod_ip="10.0.0.1", api_host="http://127.0.0.1:1"),
    ]
    for mechanism in mechanisms:
        assert callable(mechanism.start) and callable(mechanism.stop)


# -- where each node serves PeersV1 ------------------------------------------------------


def test_static_entry_may_name_the_peer_address() -> None:
    text = "10.0.0.1:1051/7000, 10.0.0.2:1051/10.1.0.2:7000, [::1]:1051/7000, 10.0.0.3:1051"
    assert parse_peers(text) == [
        PeerInfo("10.0.0.1:1051", peer_address="10.0.0.1:7000"),
        PeerInfo("10.0.0.2:1051", peer_address="10.1.0.2:7000"),
        PeerInfo("[::1]:1051", peer_address="[::1]:7000"),
        PeerInfo("10.0.0.3:1051"),
    ]


@pytest.mark.parametrize("bad", ["a:1051/", "a:1051/x", "a:1051/70000", "a:1051/b:0", "a/7000"])
def test_static_rejects_bad_peer_addresses(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_peers(bad)


def test_peers_flag_takes_the_peer_suffix_and_names_a_bad_one() -> None:
    flags = {"grpc_address": "127.0.0.1:1051", "peers": "127.0.0.1:1051,127.0.0.2:1051/7000"}
    config = build_config({}, flags)
    assert config.peers == ("127.0.0.1:1051", "127.0.0.2:1051/7000")
    with pytest.raises(ConfigError, match="peers"):
        build_config({}, {"peers": "127.0.0.2:1051/nohost:"})


async def test_cli_advertises_the_peer_listener() -> None:
    flags = {
        "grpc_address": "127.0.0.1:1051",
        "peer_address": "127.0.0.1:7000",
        "peers": "127.0.0.2:1051/7001",
    }
    rec = Recorder()
    await build_discovery(build_config({}, flags)).start(rec)
    assert rec.lists[-1] == [
        PeerInfo("127.0.0.1:1051", "127.0.0.1:1050", peer_address="127.0.0.1:7000"),
        PeerInfo("127.0.0.2:1051", peer_address="127.0.0.2:7001"),
    ]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, "10.0.0.1:1052"),  # gRPC port + 1 on the advertised host
        ({"peer_address": "10.7.0.1:7000"}, "10.7.0.1:7000"),
        ({"peer_address": "0.0.0.0:7000"}, "10.0.0.1:7000"),  # a wildcard: advertised host
        ({"peer_address": ":7000"}, "10.0.0.1:7000"),
        ({"peer_address": "127.0.0.1:0"}, ""),  # chosen at bind: peers derive it
        ({"peers_on_grpc_port": True}, "10.0.0.1:1051"),
    ],
)
def test_config_advertise_peer(changes: dict[str, Any], expected: str) -> None:
    base = ClusterConfig(grpc_address="0.0.0.0:1051", advertise_address="10.0.0.1:1051")
    assert replace(base, **changes).advertise_peer == expected


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("10.0.0.1:1052", "10.0.0.99:1052"),  # port + 1 follows the etcd advertise address
        ("10.0.0.1:1051", "10.0.0.99:1051"),  # on the gRPC port: follows it
        ("10.1.0.1:7000", "10.1.0.1:7000"),  # explicit: stays
        ("", ""),
    ],
)
def test_env_etcd_advertise_address_moves_a_derived_peer_address(peer: str, expected: str) -> None:
    env = {"GUBER_PEER_DISCOVERY_TYPE": "etcd", "GUBER_ETCD_ADVERTISE_ADDRESS": "10.0.0.99:1051"}
    found = options_from_env(env, replace(ME, peer_address=peer))
    assert found is not None and found[1]["advertise"].peer_address == expected


@pytest.mark.parametrize(
    ("on_grpc_port", "record", "expected"),
    [
        (False, "", "127.0.0.2:1052"),  # a Gubernator record: port + 1
        (True, "", "127.0.0.2:1051"),  # ... or the gRPC port, as Gubernator serves it
        (False, "127.0.0.2:7000", "127.0.0.2:7000"),  # the record's address wins
        (True, "127.0.0.2:7000", "127.0.0.2:7000"),
    ],
)
async def test_node_dials_the_peer_address_its_record_names(
    on_grpc_port: bool, record: str, expected: str
) -> None:
    node = Node(ClusterConfig(grpc_address="127.0.0.1:1051", peers_on_grpc_port=on_grpc_port))
    try:
        other = PeerInfo("127.0.0.2:1051", peer_address=record)
        node.set_peers([PeerInfo("127.0.0.1:1051"), other])
        assert node.clients["127.0.0.2:1051"].target == expected
    finally:
        await node.close()


async def test_node_redials_when_a_record_moves_its_peer_address() -> None:
    node = Node(ClusterConfig(grpc_address="127.0.0.1:1051"))
    try:
        node.set_peers([PeerInfo("127.0.0.2:1051")])
        first = node.clients["127.0.0.2:1051"]
        node.set_peers([PeerInfo("127.0.0.2:1051")])
        assert node.clients["127.0.0.2:1051"] is first  # unchanged record: same client
        node.set_peers([PeerInfo("127.0.0.2:1051", peer_address="127.0.0.2:7000")])
        assert node.clients["127.0.0.2:1051"].target == "127.0.0.2:7000"
        assert list(node.ring.nodes) == ["127.0.0.1:1051", "127.0.0.2:1051"]
    finally:
        await node.close()
