"""Kubernetes discovery against an API-shaped HTTP server on loopback.

No Kubernetes cluster is available here. ``FakeApiServer`` is a real HTTP/1.1 server that
speaks the discovery.k8s.io/v1 EndpointSlice list and watch endpoints the way the API
server does (JSON list with ``metadata.resourceVersion``, chunked newline-delimited watch
events, ``labelSelector`` equality matching, ``resourceVersion`` resumption, ``410 Gone``
for expired versions, ``timeoutSeconds``). It is not a cluster: no auth, no other kinds.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from prometheus_client import CollectorRegistry

from smockron.cluster.client import AsyncClient
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery import make_discovery
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.discovery.kubernetes import (
    KubernetesDiscovery,
    peers_from_slice,
)
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.server import ClusterServer
from smockron.errors import ConfigError, MalformedEvent
from tests.cluster.test_discovery_support import (
    Recorder,
    assert_each_forwards_to_the_other,
    peer_count_becomes,
    until,
)
from tests.support import Proc, free_ports, run_smockron, stopping, wait_port

NS = "rate"
MALFORMED = "smockron_discovery_malformed_total"
ERRORS = "smockron_discovery_errors_total"
PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
SERVICE = "gubernator"


def endpoint_slice(
    name: str,
    ips: dict[str, bool | None],
    service: str = SERVICE,
    ports: dict[str, int] | None = None,
) -> dict[str, Any]:
    """An EndpointSlice object; ``ips`` maps pod IP -> ready condition (None = absent);
    ``ports``: the slice's named ports (a gRPC one at 1051 by default)."""
    endpoints = []
    for ip, ready in ips.items():
        conditions = {} if ready is None else {"ready": ready}
        endpoints.append({"addresses": [ip], "conditions": conditions})
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [
            {"name": name, "port": port, "protocol": "TCP"}
            for name, port in (ports or {"grpc": 1051}).items()
        ],
    }


@dataclass
class ApiState:
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[int, str, dict[str, Any] | str]] = field(default_factory=list)
    version: int = 100
    oldest: int = 0  # watches from before this version get 410 Gone
    requests: list[str] = field(default_factory=list)
    authorization: set[str] = field(default_factory=set)
    cond: threading.Condition = field(default_factory=threading.Condition)
    closing: bool = False

    def put(self, obj: dict[str, Any]) -> None:
        with self.cond:
            self.version += 1
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["resourceVersion"] = str(self.version)
            kind = "MODIFIED" if obj["metadata"]["name"] in self.slices else "ADDED"
            self.slices[obj["metadata"]["name"]] = obj
            self.events.append((self.version, kind, obj))
            self.cond.notify_all()

    def delete(self, name: str) -> None:
        with self.cond:
            self.version += 1
            obj = self.slices.pop(name)
            self.events.append((self.version, "DELETED", obj))
            self.cond.notify_all()

    def raw_line(self, line: str) -> None:
        """Send a raw line (e.g. garbage) to current watchers."""
        with self.cond:
            self.version += 1
            self.events.append((self.version, "RAW", line))
            self.cond.notify_all()

    def expire(self) -> None:
        """Compaction: every version up to now is gone; open watches get 410 next."""
        with self.cond:
            self.oldest = self.version + 1
            self.version += 1
            self.events.append((self.version, "GONE", ""))
            self.cond.notify_all()


def selected(obj: dict[str, Any], selector: str) -> bool:
    labels = obj["metadata"].get("labels", {})
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: ApiState

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.state.requests.append(self.path)
        self.state.authorization.add(self.headers.get("Authorization", ""))
        if url.path != PATH:
            self.send_error(404)
            return
        selector = query.get("labelSelector", "")
        if query.get("watch") in ("true", "True", "1"):
            self._watch(selector, int(query.get("resourceVersion") or 0), query)
        else:
            self._list(selector)

    def _list(self, selector: str) -> None:
        with self.state.cond:
            items = [s for s in self.state.slices.values() if selected(s, selector)]
            body = json.dumps(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSliceList",
                    "metadata": {"resourceVersion": str(self.state.version)},
                    "items": items,
                }
            ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, line: str) -> None:
        data = line.encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, selector: str, since: int, query: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + float(query.get("timeoutSeconds", "30"))
        state = self.state
        try:
            with state.cond:
                while not state.closing and time.monotonic() < deadline:
                    if since < state.oldest:
                        gone = {
                            "kind": "Status",
                            "code": 410,
                            "reason": "Expired",
                            "message": "too old resource version",
                        }
                        self._chunk(json.dumps({"type": "ERROR", "object": gone}))
                        break
                    for version, kind, obj in [e for e in state.events if e[0] > since]:
                        since = version
                        if kind == "RAW":
                            self._chunk(str(obj))
                        elif kind != "GONE" and isinstance(obj, dict) and selected(obj, selector):
                            self._chunk(json.dumps({"type": kind, "object": obj}))
                    if since < state.oldest:
                        continue
                    state.cond.wait(0.2)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client went away
        self.close_connection = True


@pytest.fixture
def api() -> Iterator[tuple[ApiState, str]]:
    state = ApiState()
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    with state.cond:
        state.closing = True
        state.cond.notify_all()
    server.shutdown()
    server.server_close()
    thread.join(5)


def discovery(host: str, **kw: Any) -> KubernetesDiscovery:
    opts: dict[str, Any] = {
        "namespace": NS,
        "service_name": SERVICE,
        "pod_ip": "10.2.0.1",
        "pod_port": 1051,
        "api_host": host,
        "backoff": 0.1,
        "watch_timeout": 5,
    }
    opts.update(kw)
    return KubernetesDiscovery(**opts)


def test_peers_from_slice_ready_only_self_always() -> None:
    obj = endpoint_slice(
        "s", {"10.2.0.1": False, "10.2.0.2": True, "10.2.0.3": None, "10.2.0.4": False}
    )
    assert peers_from_slice(obj, 81, pod_ip="10.2.0.1") == [
        PeerInfo("10.2.0.1:81"),
        PeerInfo("10.2.0.2:81"),
        PeerInfo("10.2.0.3:81"),
    ]
    obj["addressType"] = "FQDN"
    assert peers_from_slice(obj, 81) == []
    with pytest.raises(MalformedEvent):
        peers_from_slice({"endpoints": "nope"}, 81)


def test_a_port_named_peers_gives_the_peer_address() -> None:
    obj = endpoint_slice("s", {"10.2.0.2": True}, ports={"grpc": 81, "peers": 7000})
    assert peers_from_slice(obj, 81) == [PeerInfo("10.2.0.2:81", peer_address="10.2.0.2:7000")]
    assert peers_from_slice(obj, 81, peer_port_name="") == [PeerInfo("10.2.0.2:81")]
    obj["addressType"] = "IPv6"
    obj["endpoints"][0]["addresses"] = ["fd00::2"]
    assert peers_from_slice(obj, 81) == [PeerInfo("[fd00::2]:81", peer_address="[fd00::2]:7000")]
    for bad in ("7000", 0, 70000, True, None):
        obj["ports"][1]["port"] = bad
        with pytest.raises(MalformedEvent, match="peers"):
            peers_from_slice(obj, 81)


async def test_list_then_watch_changes(api: tuple[ApiState, str]) -> None:
    state, host = api
    state.put(endpoint_slice("gub-a", {"10.2.0.1": False, "10.2.0.2": True, "10.2.0.3": None}))
    state.put(endpoint_slice("gub-b", {"10.2.0.4": False}))
    state.put(endpoint_slice("other", {"10.9.9.9": True}, service="other"))
    rec = Recorder()
    disc = discovery(host)
    await disc.start(rec)
    assert rec.addresses == {"10.2.0.1:1051", "10.2.0.2:1051", "10.2.0.3:1051"}

    state.put(endpoint_slice("gub-b", {"10.2.0.4": True}))  # becomes ready
    await rec.wait_for({"10.2.0.1:1051", "10.2.0.2:1051", "10.2.0.3:1051", "10.2.0.4:1051"})
    state.delete("gub-a")
    await rec.wait_for({"10.2.0.1:1051", "10.2.0.4:1051"})
    state.put(endpoint_slice("other", {"10.9.9.8": True}, service="other"))  # not selected
    await disc.stop()
    assert "10.9.9.8:1051" not in rec.addresses
    watches = [r for r in state.requests if "watch=" in r]
    assert watches and all("resourceVersion=" in r for r in watches)
    selectors = {parse_qs(urlparse(r).query)["labelSelector"][0] for r in state.requests}
    assert selectors == {"kubernetes.io/service-name=gubernator"}
    assert disc.lists == 1  # one list, then only the watch


async def test_gone_relists(api: tuple[ApiState, str]) -> None:
    state, host = api
    state.put(endpoint_slice("gub-a", {"10.2.0.2": True}))
    rec = Recorder()
    disc = discovery(host)
    await disc.start(rec)
    state.expire()
    state.put(endpoint_slice("gub-a", {"10.2.0.2": True, "10.2.0.5": True}))
    await rec.wait_for({"10.2.0.1:1051", "10.2.0.2:1051", "10.2.0.5:1051"})
    await disc.stop()
    assert disc.lists >= 2 and disc.malformed == 0
    assert state.authorization == {""}


async def test_bearer_token_is_sent(api: tuple[ApiState, str]) -> None:
    state, host = api
    state.put(endpoint_slice("gub-a", {"10.2.0.2": True}))
    rec = Recorder()
    disc = discovery(host, token="s3cret")
    await disc.start(rec)
    await disc.stop()
    assert rec.addresses == {"10.2.0.1:1051", "10.2.0.2:1051"}
    assert state.authorization == {"Bearer s3cret"}


@pytest.mark.parametrize(
    "garbage",
    [
        "{not json",
        '{"type": "ADDED", "object": {"metadata": {}}}',
        '{"type": "EXPLODE", "object": {}}',
        "[]",
    ],
)
async def test_garbage_in_watch_is_counted_and_recovered(
    api: tuple[ApiState, str], garbage: str
) -> None:
    state, host = api
    state.put(endpoint_slice("gub-a", {"10.2.0.2": True}))
    rec = Recorder()
    disc = discovery(host)
    await disc.start(rec)
    state.raw_line(garbage)
    state.put(endpoint_slice("gub-a", {"10.2.0.6": True}))
    await rec.wait_for({"10.2.0.1:1051", "10.2.0.6:1051"})
    await disc.stop()
    assert disc.malformed >= 1
    counted = disc.metrics.registry.get_sample_value(MALFORMED, {"mechanism": "kubernetes"})
    assert counted == disc.malformed


async def test_counters_are_per_instance(api: tuple[ApiState, str]) -> None:
    """Two discoveries in one process, on their own registries: a bad port in the slice
    one of them selects is counted by that one only."""
    state, host = api
    state.put(endpoint_slice("gub-a", {"10.2.0.2": True}))
    bad = endpoint_slice("other-a", {"10.3.0.2": True}, service="other", ports={"peers": -1})
    state.put(bad)
    registries = [CollectorRegistry(), CollectorRegistry()]
    first = discovery(host, registry=registries[0])
    second = discovery(host, service_name="other", pod_ip="10.3.0.1", registry=registries[1])
    for disc in (first, second):
        await disc.start(Recorder())
    await until(lambda: second.malformed > 0)
    await second.stop()
    await first.stop()
    labels = {"mechanism": "kubernetes"}
    assert registries[1].get_sample_value(MALFORMED, labels) == second.malformed >= 1
    assert (registries[1].get_sample_value(ERRORS, labels) or 0) >= 1
    assert registries[0].get_sample_value(MALFORMED, labels) == first.malformed == 0
    assert registries[0].get_sample_value(ERRORS, labels) == 0


@pytest.mark.slow
async def test_api_down_at_start_serves_alone() -> None:
    rec = Recorder()
    disc = discovery(f"http://127.0.0.1:{free_ports(1)[0]}", start_timeout=0.5)
    await disc.start(rec)
    assert rec.lists == [[PeerInfo("10.2.0.1:1051")]]
    started = time.monotonic()
    await disc.stop()
    assert time.monotonic() - started < 3


@pytest.mark.slow
async def test_stop_is_prompt_while_watch_blocks(api: tuple[ApiState, str]) -> None:
    state, host = api
    state.put(endpoint_slice("gub-a", {"10.2.0.2": True}))
    disc = make_discovery(
        "k8s",
        namespace=NS,
        selector=f"kubernetes.io/service-name={SERVICE}",
        pod_ip="10.2.0.1",
        api_host=host,
        watch_timeout=60,
    )
    await disc.start(Recorder())
    started = time.monotonic()
    await disc.stop()
    assert time.monotonic() - started < 3


async def test_rewatch_after_server_timeout_without_relisting(api: tuple[ApiState, str]) -> None:
    state, host = api
    state.put(endpoint_slice("gub-a", {"10.2.0.2": True}))
    rec = Recorder()
    disc = discovery(host, watch_timeout=1)
    await disc.start(rec)
    state.put(endpoint_slice("gub-a", {"10.2.0.2": True, "10.2.0.3": True}))
    await rec.wait_for({"10.2.0.1:1051", "10.2.0.2:1051", "10.2.0.3:1051"})
    for _ in range(60):  # the server ends each watch after 1 s; wait for a second one
        if sum("watch=" in r for r in state.requests) >= 2:
            break
        await asyncio.sleep(0.05)
    state.delete("gub-a")
    await rec.wait_for({"10.2.0.1:1051"})
    await disc.stop()
    versions = [
        int(parse_qs(urlparse(r).query)["resourceVersion"][0])
        for r in state.requests
        if "watch=" in r
    ]
    assert len(versions) >= 2 and versions == sorted(versions) and versions[-1] > versions[0]
    assert disc.lists == 1  # resumed from the last version, never listed again


async def test_two_cluster_nodes_follow_endpoint_slices(
    api: tuple[ApiState, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: two ``smockron cluster`` processes (pods 127.0.0.1 and 127.0.0.2, one
    gRPC port) discover each other through the API server via a kubeconfig file."""
    state, host = api
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters:\n- name: fake\n  cluster: {{server: '{host}'}}\n"
        "users:\n- name: u\n  user: {token: t0k}\n"
        "contexts:\n- name: c\n  context: {cluster: fake, user: u, namespace: rate}\n"
    )
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    grpc_port, http_a, http_b = free_ports(3)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("GUBER_K8S_POD_PORT", str(grpc_port))
    state.put(endpoint_slice("gub-a", {"127.0.0.1": True, "127.0.0.2": True}))
    procs: list[Proc] = []
    with stopping(procs):
        for ip, http in (("127.0.0.1", http_a), ("127.0.0.2", http_b)):
            args = [
                "cluster",
                "--grpc-address",
                f"{ip}:{grpc_port}",
                "--http-address",
                f"127.0.0.1:{http}",
                "--peer-discovery",
                "k8s",
                "--k8s-namespace",
                NS,
                "--k8s-pod-ip",
                ip,
                "--k8s-selector",
                f"kubernetes.io/service-name={SERVICE}",
            ]
            procs.append(run_smockron(args, tmp_path / f"{ip}.log"))
        for http in (http_a, http_b):
            wait_port(http, 20)
        async with AsyncClient(f"127.0.0.2:{grpc_port}", timeout=5) as b:
            await peer_count_becomes(b, 2)
        async with AsyncClient(f"127.0.0.1:{grpc_port}", timeout=5) as a:
            await peer_count_becomes(a, 2)
            state.put(endpoint_slice("gub-a", {"127.0.0.1": True, "127.0.0.2": False}))
            await peer_count_becomes(a, 1)
            assert (await a.health_check()).healthy
        assert "Bearer t0k" in state.authorization


def test_missing_kubeconfig_fails_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="kubeconfig"):
        make_discovery("k8s", service_name="g", kubeconfig=str(tmp_path / "missing"))


async def test_two_nodes_meet_at_the_named_peers_port(api: tuple[ApiState, str]) -> None:
    """Pods 127.0.0.1 and 127.0.0.2 serve PeersV1 on a port that is not the gRPC port + 1;
    the slice's port named ``peers`` tells each where to call the other."""
    state, host = api
    grpc_port, peer_port = free_ports(2)
    state.put(
        endpoint_slice(
            "gub-a",
            {"127.0.0.1": True, "127.0.0.2": True},
            ports={"grpc": grpc_port, "peers": peer_port},
        )
    )
    servers: list[ClusterServer] = []
    try:
        for ip in ("127.0.0.1", "127.0.0.2"):
            config = ClusterConfig(
                grpc_address=f"{ip}:{grpc_port}", http_address="", peer_address=f"{ip}:{peer_port}"
            )
            metrics = ClusterMetrics()
            disc = discovery(host, pod_ip=ip, pod_port=grpc_port, registry=metrics.registry)
            servers.append(ClusterServer(config, disc, metrics=metrics))
            await servers[-1].start()
        a, b = servers
        await until(lambda: all(len(s.node.ring.nodes) == 2 for s in servers))
        assert a.node.clients[b.node.address].target == f"127.0.0.2:{peer_port}"
        assert b.node.clients[a.node.address].target == f"127.0.0.1:{peer_port}"
        await assert_each_forwards_to_the_other(a, b)
    finally:
        for server in servers:
            await server.stop()
