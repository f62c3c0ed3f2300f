"""Static discovery and the factory."""

from __future__ import annotations

import pytest

from smockron.cluster.discovery import make_discovery, options_from_env
from smockron.cluster.discovery.base import Discovery, PeerInfo
from smockron.cluster.discovery.dns import DnsDiscovery
from smockron.cluster.discovery.etcd import EtcdDiscovery
from smockron.cluster.discovery.kubernetes import KubernetesDiscovery
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
        ({"GUBER_PEER_DISCOVERY_TYPE": "member-list"}, "not supported"),
        ({"GUBER_PEER_DISCOVERY_TYPE": "dns"}, "GUBER_DNS_FQDN"),
        ({"GUBER_PEER_DISCOVERY_TYPE": "k8s"}, "GUBER_K8S_ENDPOINTS_SELECTOR"),
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
