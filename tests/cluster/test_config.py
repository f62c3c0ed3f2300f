"""Config: Go durations, GUBER_* variables, flags over env, validation."""

from __future__ import annotations

import json
import socket
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from smockron.cluster.build import build_config, build_discovery
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.static import StaticDiscovery
from smockron.cluster.guber_env import from_env, guber_log_level
from smockron.cluster.node import Node
from smockron.core.hashring import HashRing
from smockron.errors import ConfigError
from smockron.settings import parse_go_duration_ms
from tests.support import free_ports, run_smockron, smockron_proc, wait_for, wait_port


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500us", 0.5),
        ("100ms", 100.0),
        ("1s", 1000.0),
        ("1m30s", 90_000.0),
        ("2.5", 2.5),
        ("1h", 3_600_000.0),
        ("750µs", 0.75),
    ],
)
def test_go_durations(text: str, ms: float) -> None:
    assert parse_go_duration_ms(text) == pytest.approx(ms)


@pytest.mark.parametrize("text", ["", "fast", "10 ms", "5d", "ms"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_go_duration_ms(text)


def test_defaults_are_gubernators() -> None:
    c = ClusterConfig()
    assert (c.grpc_address, c.http_address) == ("127.0.0.1:1051", "127.0.0.1:1050")
    assert (c.batch_wait_ms, c.batch_limit, c.global_sync_wait_ms, c.global_batch_limit) == (
        0.5,
        1000,
        100.0,
        1000,
    )


def test_env_then_flags() -> None:
    env = {
        "GUBER_GRPC_ADDRESS": "127.0.0.1:9051",
        "GUBER_HTTP_ADDRESS": "127.0.0.1:9050",
        "GUBER_BATCH_WAIT": "1ms",
        "GUBER_BATCH_LIMIT": "50",
        "GUBER_GLOBAL_SYNC_WAIT": "20ms",
        "GUBER_GLOBAL_BATCH_LIMIT": "7",
        "GUBER_CACHE_SIZE": "99",
        "GUBER_ADVERTISE_ADDRESS": "10.0.0.1:9051",
    }
    c = from_env(env)
    assert (c.grpc_address, c.batch_wait_ms, c.batch_limit, c.global_sync_wait_ms) == (
        "127.0.0.1:9051",
        1.0,
        50,
        20.0,
    )
    assert (c.global_batch_limit, c.cache_size, c.advertise) == (7, 99, "10.0.0.1:9051")
    flagged = build_config(env, {"batch_limit": 3, "peers": "a:1, b:2", "grpc_address": None})
    assert (flagged.batch_limit, flagged.peers, flagged.grpc_address) == (
        3,
        ("a:1", "b:2"),
        "127.0.0.1:9051",
    )


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="GUBER_BATCH_LIMIT"):
        from_env({"GUBER_BATCH_LIMIT": "lots"})
    with pytest.raises(ConfigError, match="batch_limit must be >= 1"):
        build_config({}, {"batch_limit": 0})
    with pytest.raises(ConfigError, match="global_batch_limit must be <= 1000"):
        build_config({"GUBER_GLOBAL_BATCH_LIMIT": "5000"}, {})


def test_static_discovery_from_peers() -> None:
    config = build_config({}, {"peers": "127.0.0.1:1,127.0.0.1:2", "grpc_address": "127.0.0.1:1"})
    assert isinstance(build_discovery(config), StaticDiscovery)
    with pytest.raises(ConfigError, match="GUBER_DNS_FQDN"):
        build_discovery(build_config({}, {"peer_discovery": "dns"}))


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_smockron(
            ["cluster", "--grpc-address", f"127.0.0.1:{port}", "--http-address", ""],
            tmp_path / "node.log",
        )
        code = proc.popen.wait(30)
        log = proc.log()
        proc.stop()
    assert code == 1
    # Gubernator's words: errors.Wrap(err, "while starting GRPC listener") over Go's error
    expected = f"while starting GRPC listener: listen tcp 127.0.0.1:{port}: bind: address"
    assert f"smockron cluster: error: {expected} already in use" in log
    assert "Traceback" not in log


def test_wildcard_grpc_address_advertises_a_dialable_one() -> None:
    config = build_config({"GUBER_GRPC_ADDRESS": ":9051"}, {})
    assert config.grpc_address == "0.0.0.0:9051"
    host, _, port = config.advertise.rpartition(":")
    assert port == "9051" and host not in ("", "0.0.0.0")
    pinned = build_config(
        {}, {"grpc_address": "0.0.0.0:9051", "advertise_address": "10.1.2.3:9051"}
    )
    assert pinned.advertise == "10.1.2.3:9051"


def test_guber_environment_configures_a_real_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g, h = free_ports(2)
    monkeypatch.setenv("GUBER_GRPC_ADDRESS", f"127.0.0.1:{g}")
    monkeypatch.setenv("GUBER_HTTP_ADDRESS", f"127.0.0.1:{h}")
    monkeypatch.setenv("GUBER_BATCH_WAIT", "1ms")
    with smockron_proc(["cluster"], tmp_path / "node.log"):
        wait_port(g)
        wait_port(h)
        url = f"http://127.0.0.1:{h}/v1/HealthCheck"
        with urllib.request.urlopen(url, timeout=5) as resp:
            health = json.loads(resp.read())
    assert health["advertise_address"] == f"127.0.0.1:{g}"
    assert health["peer_count"] == 1


def test_peer_picker_hash_and_replicas_from_env_and_flag() -> None:
    env = {"GUBER_PEER_PICKER_HASH": "fnv1", "GUBER_REPLICATED_HASH_REPLICAS": "64"}
    config = build_config(env, {})
    assert (config.peer_picker_hash, config.peer_picker_replicas) == ("fnv1", 64)
    assert build_config(env, {"peer_picker_hash": "fnv1a"}).peer_picker_hash == "fnv1a"
    assert ClusterConfig().peer_picker_hash == "fnv1a-mix"
    with pytest.raises(ConfigError, match="peer_picker_hash must be one of fnv1a-mix, fnv1a"):
        build_config({"GUBER_PEER_PICKER_HASH": "md5"}, {})
    with pytest.raises(ConfigError, match="GUBER_REPLICATED_HASH_REPLICAS"):
        from_env({"GUBER_REPLICATED_HASH_REPLICAS": "many"})
    with pytest.raises(ConfigError, match="peer_picker_replicas must be >= 1"):
        build_config({"GUBER_REPLICATED_HASH_REPLICAS": "0"}, {})


async def test_node_ring_uses_the_configured_hash() -> None:
    peers = [f"127.0.0.1:{1051 + i}" for i in range(3)]
    keys = [f"name_account:{i}" for i in range(300)]
    for hash_name in ("fnv1a-mix", "fnv1a", "fnv1"):
        config = build_config(
            {"GUBER_REPLICATED_HASH_REPLICAS": "32"}, {"peer_picker_hash": hash_name}
        )
        node = Node(replace(config, grpc_address=peers[0]))
        node.ring.set_nodes(peers)
        oracle = HashRing(peers, 32, hash=hash_name)
        assert [node.ring.owner(k) for k in keys] == [oracle.owner(k) for k in keys]
    # the hashes really differ, so the test above tells them apart
    owners = {
        h: [HashRing(peers, 32, hash=h).owner(k) for k in keys] for h in ("fnv1a-mix", "fnv1")
    }
    assert owners["fnv1a-mix"] != owners["fnv1"]


def test_guber_log_level_names() -> None:
    assert guber_log_level({}) is None
    assert guber_log_level({"GUBER_LOG_LEVEL": "warn"}) == "WARNING"
    assert guber_log_level({"GUBER_LOG_LEVEL": "Error"}) == "ERROR"
    assert guber_log_level({"GUBER_LOG_LEVEL": "trace"}) == "DEBUG"  # logrus's finest
    assert guber_log_level({"GUBER_DEBUG": "true", "GUBER_LOG_LEVEL": "error"}) == "DEBUG"
    with pytest.raises(ConfigError, match="GUBER_LOG_LEVEL: unknown level 'loud'"):
        guber_log_level({"GUBER_LOG_LEVEL": "loud"})


@pytest.mark.parametrize(
    ("top_flags", "info_logged"), [([], False), (["--log-level", "INFO"], True)]
)
def test_guber_log_level_applies_unless_smockron_level_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, top_flags: list[str], info_logged: bool
) -> None:
    g, h = free_ports(2)
    monkeypatch.delenv("SMOCKRON_LOG_LEVEL", raising=False)
    monkeypatch.setenv("GUBER_LOG_LEVEL", "error")
    args = [
        *top_flags,
        "cluster",
        "--grpc-address",
        f"127.0.0.1:{g}",
        "--http-address",
        f"127.0.0.1:{h}",
    ]
    with smockron_proc(args, tmp_path / "node.log") as proc:
        wait_for(lambda: "serving" in proc.log())
    assert ("INFO smockron.cluster" in proc.log()) is info_logged


def test_envoy_response_headers_from_env_and_flag() -> None:
    assert build_config({}, {}).envoy_response_headers is False
    on = {"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}
    assert build_config(on, {}).envoy_response_headers is True
    assert build_config(on, {"envoy_response_headers": False}).envoy_response_headers is False
    with pytest.raises(ConfigError, match="LIMIT_RESPONSE_HEADERS_ENABLED: must be true or false"):
        build_config({"LIMIT_RESPONSE_HEADERS_ENABLED": "sometimes"}, {})


def test_guber_tls_variables() -> None:
    env = {
        "GUBER_TLS_CA": "/c/ca.pem",
        "GUBER_TLS_CA_KEY": "/c/ca.key",
        "GUBER_TLS_CERT": "/c/cert.pem",
        "GUBER_TLS_KEY": "/c/key.pem",
        "GUBER_TLS_AUTO": "false",
        "GUBER_TLS_CLIENT_AUTH": "require-and-verify",
        "GUBER_TLS_CLIENT_AUTH_CA_CERT": "/c/client-ca.pem",
        "GUBER_TLS_CLIENT_AUTH_CERT": "/c/client.pem",
        "GUBER_TLS_CLIENT_AUTH_KEY": "/c/client.key",
        "GUBER_TLS_CLIENT_AUTH_SERVER_NAME": "gubernator",
        "GUBER_TLS_INSECURE_SKIP_VERIFY": "true",
    }
    config = from_env(env).validate()
    assert config.tls
    assert (config.tls_ca, config.tls_ca_key, config.tls_cert, config.tls_key) == (
        "/c/ca.pem",
        "/c/ca.key",
        "/c/cert.pem",
        "/c/key.pem",
    )
    assert config.tls_client_auth == "require-and-verify"
    assert config.tls_client_auth_ca_cert == "/c/client-ca.pem"
    assert (config.tls_client_auth_cert, config.tls_client_auth_key) == (
        "/c/client.pem",
        "/c/client.key",
    )
    assert config.tls_client_auth_server_name == "gubernator"
    assert config.tls_insecure_skip_verify and not config.tls_auto
    assert not ClusterConfig().tls
    assert from_env({"GUBER_TLS_AUTO": "true"}).validate().tls
    status = from_env({"GUBER_STATUS_HTTP_ADDRESS": "127.0.0.1:1052"})
    assert status.status_http_address == "127.0.0.1:1052"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GUBER_TLS_AUTO": "1", "GUBER_TLS_CLIENT_AUTH": "always"}, "tls_client_auth must"),
        ({"GUBER_TLS_CERT": "/c.pem"}, "GUBER_TLS_KEY"),
        ({"GUBER_TLS_CA": "/ca.pem"}, "no server certificate"),
        ({"GUBER_TLS_AUTO": "1", "GUBER_TLS_CLIENT_AUTH": "verify-cert"}, "no CA's provided"),
        ({"GUBER_TLS_AUTO": "1", "GUBER_TLS_CA_KEY": "/k"}, "needs the CA certificate"),
        ({"GRPC_SERVER_USE_TLS": "true"}, "GRPC_SERVER_TLS_CERT"),
        ({"GUBER_TLS_AUTO": "maybe"}, "GUBER_TLS_AUTO"),
    ],
)
def test_bad_tls_settings(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_env(env).validate()


def test_envoy_ratelimit_tls_variables_are_aliases() -> None:
    env = {
        "GRPC_SERVER_USE_TLS": "true",
        "GRPC_SERVER_TLS_CERT": "/r/cert.pem",
        "GRPC_SERVER_TLS_KEY": "/r/key.pem",
        "GRPC_CLIENT_TLS_CACERT": "/r/ca.pem",
    }
    config = from_env(env).validate()
    assert (config.tls_cert, config.tls_key) == ("/r/cert.pem", "/r/key.pem")
    assert config.tls_client_auth == "require-and-verify"
    assert config.tls_client_auth_ca_cert == "/r/ca.pem"
    # off unless GRPC_SERVER_USE_TLS; the GUBER_TLS_* variables win
    assert not from_env({**env, "GRPC_SERVER_USE_TLS": "false"}).tls
    both = from_env({**env, "GUBER_TLS_CERT": "/g/cert.pem"})
    assert both.tls_cert == "/g/cert.pem"


def test_tls_flags(tmp_path: Path) -> None:
    config = build_config(
        {"GUBER_TLS_CERT": "/env.pem"},
        {
            "tls_cert": "/flag.pem",
            "tls_key": "/flag.key",
            "tls_auto": None,
            "tls_client_auth": "verify-cert",
            "tls_ca": "/ca.pem",
        },
    )
    assert (config.tls_cert, config.tls_key, config.tls_client_auth) == (
        "/flag.pem",
        "/flag.key",
        "verify-cert",
    )


def test_unreadable_tls_file_stops_the_command(tmp_path: Path) -> None:
    from smockron.cluster import tls

    config = ClusterConfig(tls_cert=str(tmp_path / "none.pem"), tls_key="/none.key")
    with pytest.raises(ConfigError, match="while reading GUBER_TLS_CERT"):
        tls.load(config.validate())
    (tmp_path / "bad.pem").write_text("not a certificate")
    config = replace(config, tls_cert=str(tmp_path / "bad.pem"), tls_key=str(tmp_path / "bad.pem"))
    with pytest.raises(ConfigError, match="while parsing server certificate"):
        tls.load(config)


def test_tls_min_version() -> None:
    assert from_env({"GUBER_TLS_AUTO": "1"}).tls_min_version == "1.3"
    assert from_env({"GUBER_TLS_MIN_VERSION": "1.2"}).tls_min_version == "1.2"
    with pytest.raises(ConfigError, match="tls_min_version must be one of"):
        from_env({"GUBER_TLS_AUTO": "1", "GUBER_TLS_MIN_VERSION": "1.4"}).validate()


@pytest.mark.parametrize("host", ["", "*", "0.0.0.0", "[::]"])
def test_every_wildcard_spelling_listens_everywhere_and_advertises_a_dialable_address(
    host: str,
) -> None:
    config = build_config({}, {"grpc_address": f"{host}:1051"})
    assert config.grpc_address == ("[::]:1051" if host == "[::]" else "0.0.0.0:1051")
    advertised = config.advertise_address.rpartition(":")[0]
    assert advertised and advertised not in ("*", "0.0.0.0", "[::]")
