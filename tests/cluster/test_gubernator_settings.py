"""A Gubernator deployment's settings, unchanged: its env file for ``--config``, the
k8s, logging and discovery variables it uses, and one clear refusal for what smockron
does not implement (never a node silently running alone)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from smockron.cluster.build import build_config
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery import PeerInfo, options_from_env
from smockron.cluster.guber_env import (
    IGNORED,
    REFUSED,
    is_env_file,
    read_env_file,
    warnings,
)
from smockron.errors import ConfigError
from tests.support import free_ports, run_smockron, smockron_proc, wait_for, wait_port

ME = PeerInfo("10.0.0.1:1051", "10.0.0.1:1050")


def _refusal(tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Start a node with ``env``; it must exit 2 with one error line: return that line."""
    g, h = free_ports(2)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    proc = run_smockron(
        ["cluster", "--grpc-address", f"127.0.0.1:{g}", "--http-address", f"127.0.0.1:{h}"],
        tmp_path / "node.log",
    )
    try:
        code = proc.popen.wait(30)
        log = proc.log()
    finally:
        proc.stop()
    assert code == 2, log
    lines = [line for line in log.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and "Traceback" not in log, log
    return lines[0]


def test_memberlist_variables_without_a_type_mean_member_list() -> None:
    """Gubernator's default discovery is member-list: its variables choose it."""
    env = {"GUBER_MEMBERLIST_KNOWN_NODES": "10.0.0.2:7946"}
    config = build_config(env, {})
    assert config.peer_discovery == "member-list"
    assert config.member_list.known_nodes == ("10.0.0.2:7946",)
    assert build_config({}, {}).peer_discovery == "static"
    typed = {**env, "GUBER_PEER_DISCOVERY_TYPE": "dns", "GUBER_DNS_FQDN": "g.svc"}
    assert build_config(typed, {}).peer_discovery == "dns"
    with pytest.raises(ConfigError, match="exclude each other"):
        build_config({**env, "GUBER_PEERS": "127.0.0.1:1051"}, {})
    # Gubernator's own check: member-list settings without a node to join
    with pytest.raises(ConfigError, match="MUST provide a hostname of a known host"):
        build_config({"GUBER_MEMBERLIST_ADDRESS": "10.0.0.1:7946"}, {})


@pytest.mark.parametrize("var", sorted(REFUSED))
def test_each_refused_setting_stops_the_config_naming_it(var: str) -> None:
    with pytest.raises(ConfigError, match=f"^{var} is set, but smockron does not implement"):
        build_config({var: "true"}, {})
    build_config({var: "false"}, {})  # off is what smockron does anyway
    build_config({var: "0"}, {})


def test_refused_settings_and_bad_values() -> None:
    known = {"GUBER_MEMBERLIST_KNOWN_NODES": "10.0.0.2"}
    with pytest.raises(ConfigError, match="GUBER_K8S_WATCH_MECHANISM=pods"):
        build_config({"GUBER_K8S_WATCH_MECHANISM": "pods"}, {})
    with pytest.raises(ConfigError, match="SECRET_KEYS: unable to add secret key at index 1"):
        build_config(
            {**known, "GUBER_MEMBERLIST_SECRET_KEYS": "MDEyMzQ1Njc4OWFiY2RlZg==,c2VjcmV0"}, {}
        )
    with pytest.raises(ConfigError, match="unable to base64 decode memberlist encryption key"):
        build_config({**known, "GUBER_MEMBERLIST_SECRET_KEYS": "not base64!"}, {})
    with pytest.raises(ConfigError, match=r"GUBER_PEER_DISCOVERY_TYPE: is invalid; choices"):
        build_config({"GUBER_PEER_DISCOVERY_TYPE": "consul"}, {})
    with pytest.raises(ConfigError, match="GUBER_PEER_PICKER: 'consistent-hash' is invalid"):
        build_config({"GUBER_PEER_PICKER": "consistent-hash"}, {})
    assert build_config({"GUBER_PEER_PICKER": "replicated-hash"}, {}).peer_picker_hash == "fnv1a"
    picked = {"GUBER_PEER_PICKER": "replicated-hash", "GUBER_PEER_PICKER_HASH": "fnv1"}
    assert build_config(picked, {}).peer_picker_hash == "fnv1"


def test_a_refused_setting_stops_a_real_node_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = _refusal(tmp_path, {"GUBER_FORCE_GLOBAL": "true"}, monkeypatch)
    assert "GUBER_FORCE_GLOBAL is set, but smockron does not implement" in line


def test_settings_without_effect_are_named_once_at_start() -> None:
    env = {
        "GUBER_WORKER_COUNT": "8",
        "GUBER_INSTANCE_ID": "a",
        "GUBER_GRPC_ADRESS": "x",
        "GUBER_HTTP_RETRY_COUNT": "3",
        "GUBER_GRPC_ADDRESS": "127.0.0.1:1",
    }
    lines = warnings(env)
    assert lines == [
        f"GUBER_WORKER_COUNT has no effect: {IGNORED['GUBER_WORKER_COUNT']}",
        f"GUBER_INSTANCE_ID has no effect: {IGNORED['GUBER_INSTANCE_ID']}",
        "GUBER_GRPC_ADRESS is not a Gubernator server setting: ignored (a typo?)",
    ]
    assert build_config(env, {}).ignored == tuple(lines)  # read once, logged at start
    assert warnings({"GUBER_K8S_ENDPOINTS_SELECTOR": "app=g"}) == [
        "GUBER_K8S_ENDPOINTS_SELECTOR is deprecated, use GUBER_K8S_SELECTOR instead"
    ]


def test_other_gubernator_variables() -> None:
    config = build_config(
        {
            "GUBER_GRACEFUL_TERMINATION_DELAY_SEC": "3",
            "GUBER_DISABLE_BATCHING": "true",
            "GUBER_RESOLV_CONF": "/r.conf",
            "GUBER_ETCD_DIAL_TIMEOUT": "2s",
            "GUBER_ETCD_USER": "u",
            "GUBER_ETCD_PASSWORD": "p",
        },
        {},
    )
    assert config.graceful_termination_delay_ms == 3000.0
    logs = build_config({"GUBER_LOG_FORMAT": "json", "GUBER_DEBUG": "t"}, {})
    assert (logs.log_format, logs.log_level) == ("json", "DEBUG")
    assert config.batch_wait_ms == 0.0
    assert config.dns.resolv_conf == "/r.conf"
    assert (config.etcd.dial_timeout_ms, config.etcd.username, config.etcd.password) == (
        2000.0,
        "u",
        "p",
    )
    assert "password" not in repr(config.etcd)


def test_k8s_service_name_and_selectors() -> None:
    """gubernator-io's names: the Service's EndpointSlices, else a selector; the
    deprecated GUBER_K8S_ENDPOINTS_SELECTOR still works, GUBER_K8S_SELECTOR wins."""
    k8s = {"GUBER_PEER_DISCOVERY_TYPE": "k8s", "GUBER_K8S_POD_IP": "10.4.0.2"}
    found = options_from_env(
        {**k8s, "GUBER_K8S_SERVICE_NAME": "gubernator", "GUBER_K8S_SELECTOR": "app=x"}, ME
    )
    assert found == (
        "k8s",
        {
            "namespace": "default",
            "service_name": "gubernator",
            "pod_ip": "10.4.0.2",
            "pod_port": 1051,
        },
    )
    found = options_from_env(
        {**k8s, "GUBER_K8S_SELECTOR": "app=new", "GUBER_K8S_ENDPOINTS_SELECTOR": "app=old"}, ME
    )
    assert found is not None and found[1]["selector"] == "app=new"
    found = options_from_env({**k8s, "GUBER_K8S_ENDPOINTS_SELECTOR": "app=old"}, ME)
    assert found is not None and found[1]["selector"] == "app=old"
    found = options_from_env(
        {**k8s, "GUBER_K8S_SERVICE_NAME": "g", "GUBER_K8S_WATCH_MECHANISM": "endpoints"}, ME
    )
    assert found is not None and found[1]["service_name"] == "g"


ENV_FILE = """\
# Gubernator's example.conf style
GUBER_GRPC_ADDRESS=127.0.0.1:{g}
GUBER_HTTP_ADDRESS = 127.0.0.1:{h}
  GUBER_CACHE_SIZE=this line starts with spaces: skipped, as Gubernator does
\tGUBER_CACHE_SIZE=and tabs
GUBER_BATCH_WAIT=1ms
GUBER_DATA_CENTER=dc=1
"""


def test_env_file_is_read_as_gubernator_reads_it() -> None:
    text = ENV_FILE.format(g=1, h=2)
    assert is_env_file(text)
    assert read_env_file(text) == {
        "GUBER_GRPC_ADDRESS": "127.0.0.1:1",
        "GUBER_HTTP_ADDRESS": "127.0.0.1:2",
        "GUBER_BATCH_WAIT": "1ms",
        "GUBER_DATA_CENTER": "dc=1",
    }
    assert not is_env_file("# smockron's own\ngrpc_address = '127.0.0.1:1'\n")
    assert not is_env_file("")
    with pytest.raises(ConfigError, match="malformed key=value on line 2"):
        read_env_file("GUBER_GRPC_ADDRESS=a:1\nGUBER_OOPS\n")


def test_a_real_node_takes_gubernators_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's values win over the environment's (Gubernator sets them with Setenv)."""
    g, h = free_ports(2)
    conf = tmp_path / "gubernator.conf"
    conf.write_text(ENV_FILE.format(g=g, h=h) + "GUBER_LOG_FORMAT=json\n")
    monkeypatch.setenv("GUBER_GRPC_ADDRESS", "127.0.0.1:1")
    monkeypatch.delenv("SMOCKRON_LOG_FORMAT", raising=False)
    with smockron_proc(["cluster", "--config", str(conf)], tmp_path / "node.log") as proc:
        wait_port(g)
        wait_port(h)
        with urllib.request.urlopen(f"http://127.0.0.1:{h}/v1/HealthCheck", timeout=5) as resp:
            health = json.loads(resp.read())
        wait_for(lambda: "serving" in proc.log())
    assert health["advertise_address"] == f"127.0.0.1:{g}"
    logged = [json.loads(line) for line in proc.log().splitlines() if line]
    assert logged and all(entry["msg"] for entry in logged)  # GUBER_LOG_FORMAT=json


def test_a_malformed_env_file_stops_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "gubernator.conf"
    conf.write_text("GUBER_GRPC_ADDRESS=127.0.0.1:1051\nGUBER_NO_VALUE\n")
    proc = run_smockron(["cluster", "--config", str(conf)], tmp_path / "node.log")
    try:
        code = proc.popen.wait(30)
    finally:
        proc.stop()
    assert code == 2
    assert "malformed key=value on line 2" in proc.log()


def test_guber_log_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMOCKRON_LOG_FORMAT", raising=False)
    line = _refusal(tmp_path, {"GUBER_LOG_FORMAT": "xml"}, monkeypatch)
    assert "GUBER_LOG_FORMAT is invalid; expected value is either json or text" in line


# Gubernator's config_test.go, ported as written: the same env files, read as --config
# reads them. InstanceID is not checked: smockron's nodes carry none (GUBER_INSTANCE_ID
# has no effect, one warning); GUBER_K8S_WATCH_MECHANISM=pods is refused (smockron
# watches EndpointSlices only), where those tests expect Gubernator to accept it.


def _daemon_config(text: str) -> ClusterConfig:
    """Gubernator's ``SetupDaemonConfig`` on an env file, with a clear environment."""
    return build_config(read_env_file(text), {})


def test_parses_grpc_address() -> None:
    config = _daemon_config("\n# a comment\nGUBER_GRPC_ADDRESS=10.10.10.10:9000")
    assert config.grpc_address == "10.10.10.10:9000"


def test_default_listen_address() -> None:
    config = _daemon_config("\n# a comment")
    assert (config.grpc_address, config.http_address) == ("127.0.0.1:1051", "127.0.0.1:1050")


def test_k8s_config_service_name() -> None:
    config = _daemon_config(
        "\nGUBER_K8S_SERVICE_NAME=gubernator\nGUBER_K8S_NAMESPACE=default\n"
        "GUBER_K8S_POD_IP=10.0.0.1\nGUBER_K8S_POD_PORT=9051"
    )
    assert (config.k8s.service_name, config.k8s.namespace) == ("gubernator", "default")


@pytest.mark.parametrize(
    ("text", "selector"),
    [
        (
            "GUBER_K8S_SELECTOR=app=gubernator-new\nGUBER_K8S_ENDPOINTS_SELECTOR=app=gubernator-old",
            "app=gubernator-new",
        ),
        ("GUBER_K8S_ENDPOINTS_SELECTOR=app=gubernator", "app=gubernator"),
        ("GUBER_K8S_SELECTOR=app=gubernator", "app=gubernator"),
    ],
    ids=[
        "GUBER_K8S_SELECTOR takes precedence",
        "GUBER_K8S_ENDPOINTS_SELECTOR fallback",
        "GUBER_K8S_SELECTOR preferred",
    ],
)
def test_k8s_selector_backward_compatibility(text: str, selector: str) -> None:
    assert _daemon_config(text).k8s.selector == selector
    with pytest.raises(ConfigError, match="WATCH_MECHANISM=pods: smockron watches EndpointSlices"):
        _daemon_config(text + "\nGUBER_K8S_WATCH_MECHANISM=pods")


def test_k8s_validation_endpoint_slices() -> None:
    with pytest.raises(ConfigError, match="GUBER_K8S_SERVICE_NAME"):  # ServiceName required
        _daemon_config("\nGUBER_K8S_NAMESPACE=default\nGUBER_K8S_POD_IP=10.0.0.1")
    config = _daemon_config(
        "\nGUBER_K8S_SERVICE_NAME=gubernator\nGUBER_K8S_NAMESPACE=default\n"
        "GUBER_K8S_POD_IP=10.0.0.1\nGUBER_K8S_POD_PORT=9051"
    )
    assert (config.k8s.service_name, config.k8s.mechanism) == ("gubernator", "endpointslices")
    with pytest.raises(ConfigError, match="GUBER_K8S_SERVICE_NAME"):  # explicit mechanism
        _daemon_config("\nGUBER_K8S_WATCH_MECHANISM=endpointslices\nGUBER_K8S_NAMESPACE=default")


def test_k8s_validation_pods() -> None:
    """Gubernator: the pods mechanism needs GUBER_K8S_SELECTOR; smockron refuses pods."""
    for text in (
        "GUBER_K8S_WATCH_MECHANISM=pods\nGUBER_K8S_NAMESPACE=default",
        "GUBER_K8S_WATCH_MECHANISM=pods\nGUBER_K8S_SELECTOR=app=gubernator\n"
        "GUBER_K8S_NAMESPACE=default",
    ):
        with pytest.raises(ConfigError, match="GUBER_K8S_WATCH_MECHANISM=pods"):
            _daemon_config(text)


def test_watch_mechanism_error_message() -> None:
    with pytest.raises(ConfigError) as caught:
        _daemon_config("\nGUBER_K8S_WATCH_MECHANISM=invalid\nGUBER_K8S_SERVICE_NAME=gubernator")
    assert "endpointslices" in str(caught.value) and "pods" in str(caught.value)
