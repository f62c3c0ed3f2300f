"""One HOST:PORT parser (settings.parse_host_port) for every listener and every peer
address: the --metrics flags, the cluster's listeners, discovery records."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from smockron.cli import main
from smockron.cluster.discovery._common import parse_peer
from smockron.cluster.discovery.etcd import decode_peer
from smockron.cluster.server import bind_error
from smockron.errors import ConfigError
from smockron.settings import parse_listen


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.1:9100", ("127.0.0.1", 9100)),
        ("[::1]:9100", ("::1", 9100)),
        (":9100", ("0.0.0.0", 9100)),
        ("*:9100", ("0.0.0.0", 9100)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_listen_addresses(text: str, parsed: tuple[str, int]) -> None:
    assert parse_listen(text) == parsed


@pytest.mark.parametrize(
    ("text", "message"),
    [("::1:80", "brackets"), ("host:70000", "not in 0..65535"), ("nocolon", "HOST:PORT")],
)
def test_bad_listen_addresses(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_listen(text)


@pytest.mark.parametrize("command", ["master", "proxy", "jarl", "dthrottle", "cluster", "router"])
@pytest.mark.parametrize(
    ("bad", "message"),
    [("::1:80", "brackets"), ("h:99999", "65535"), ("127.0.0.1:0", "name the port")],
)
def test_every_metrics_flag_is_checked_alike(command: str, bad: str, message: str) -> None:
    result = CliRunner().invoke(main, [command, "--metrics", bad, "--print-settings"])
    assert result.exit_code == 2, result.output
    assert "--metrics" in result.output and message in result.output


def test_cluster_listeners_refuse_a_port_out_of_range() -> None:
    assert "65535" in bind_error("127.0.0.1:99999")


GOOD_PEERS = {
    "10.0.0.1:1051": ("10.0.0.1:1051", ""),
    "[::1]:1051": ("[::1]:1051", ""),
    "node-1.example:1051": ("node-1.example:1051", ""),
    "10.0.0.1:1051/7000": ("10.0.0.1:1051", "10.0.0.1:7000"),
    "[::1]:1051/7000": ("[::1]:1051", "[::1]:7000"),
    "10.0.0.1:1051/10.0.0.9:7000": ("10.0.0.1:1051", "10.0.0.9:7000"),
}
BAD_PEERS = [
    "::1:1051",  # IPv6 without brackets
    "10.0.0.1:99999",
    "10.0.0.1:0",
    ":1051",  # no host
    "10.0.0.1:\u0661\u0660\u0665\u0661",  # Arabic-Indic digits are digits to str.isdigit
    "10.0.0.1",
    "10.0.0.1:1051/99999",
    "10.0.0.1:1051/::1:7000",
]


@pytest.mark.parametrize("text", GOOD_PEERS)
def test_discovery_records_accept(text: str) -> None:
    info = parse_peer(text)
    assert (info.grpc_address, info.peer_address) == GOOD_PEERS[text]


@pytest.mark.parametrize("text", BAD_PEERS)
def test_discovery_records_refuse(text: str) -> None:
    with pytest.raises(ValueError, match="peer address"):
        parse_peer(text)


@pytest.mark.parametrize("grpc", ["10.0.0.1:99999", "::1:1051", "10.0.0.1:0"])
def test_etcd_records_refuse_what_the_parser_refuses(grpc: str) -> None:
    with pytest.raises(ValueError):
        decode_peer(json.dumps({"grpc-address": grpc}).encode())
    with pytest.raises(ValueError):
        decode_peer(grpc.encode())  # the bare form of old releases
    good = decode_peer(
        json.dumps({"grpc-address": "[::1]:1051", "peer-address": "[::1]:1052"}).encode()
    )
    assert (good.grpc_address, good.peer_address) == ("[::1]:1051", "[::1]:1052")
