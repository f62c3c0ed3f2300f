"""TLS on real ``smockron cluster`` processes: Gubernator's tls_test.go, case by case.

Certificates are made here (smockron.cluster.tlsgen, on ``cryptography``): a CA, a server
certificate for 127.0.0.1 and localhost, one for the name ``gubernator`` only (no IP SAN),
and a client certificate from a second, client-auth CA.
"""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

pytest.importorskip("cryptography")

from smockron.cluster import tlsgen
from smockron.cluster.config import peer_address_of
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc, peers_pb2, peers_pb2_grpc
from tests.support import (
    Node,
    cluster_nodes,
    free_ports,
    run_smockron,
    wait_for,
    wait_port,
)

SERVERS = ["native", "threads", "asyncio"]


@dataclass
class Certs:
    dir: Path

    def __getattr__(self, name: str) -> str:
        return str(self.dir / name.replace("_", "."))

    def read(self, name: str) -> bytes:
        return (self.dir / name).read_bytes()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """Like upstream's contrib/certs: ca, gubernator (127.0.0.1, localhost),
    gubernator_no_ip_san (the name ``gubernator`` only), client-auth-ca and client-auth;
    and client-auth-localhost, the client certificate of envoyproxy/ratelimit's mTLS test."""
    d = tmp_path_factory.mktemp("certs")
    ca, ca_key = tlsgen.make_ca()
    client_ca, client_ca_key = tlsgen.make_ca("client-auth")
    made = {
        "ca.cert": ca,
        "ca.key": ca_key,
        "client-auth-ca.pem": client_ca,
    }
    for name, pair in {
        "gubernator": tlsgen.make_cert(ca, ca_key, ["localhost", "127.0.0.1"]),
        "gubernator_no_ip_san": tlsgen.make_cert(ca, ca_key, ["gubernator"]),
        "client-auth": tlsgen.make_cert(client_ca, client_ca_key, ["client"]),
        "client-auth-localhost": tlsgen.make_cert(client_ca, client_ca_key, ["localhost"]),
    }.items():
        made[f"{name}.pem"], made[f"{name}.key"] = pair
    for name, data in made.items():
        (d / name).write_bytes(data)
    return Certs(d)


def credentials(certs: Certs, cert: str = "", ca: str = "ca.cert") -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=certs.read(ca),
        private_key=certs.read(f"{cert}.key") if cert else None,
        certificate_chain=certs.read(f"{cert}.pem") if cert else None,
    )


def tls_request(key: str = "account:995", behavior: int = 0, hits: int = 1) -> pb.GetRateLimitsReq:
    return pb.GetRateLimitsReq(
        requests=[
            pb.RateLimitReq(
                name="test_tls",
                unique_key=key,
                algorithm=pb.TOKEN_BUCKET,
                duration=30_000,
                limit=100,
                hits=hits,
                behavior=behavior,  # type: ignore[arg-type]
            )
        ]
    )


async def make_request(
    address: str,
    creds: grpc.ChannelCredentials | None,
    options: list[tuple[str, Any]] | None = None,
    key: str = "account:995",
    behavior: int = 0,
    hits: int = 1,
) -> pb.RateLimitResp:
    if creds is None:
        channel = grpc.aio.insecure_channel(address)
    else:
        channel = grpc.aio.secure_channel(address, creds, options=options)
    async with channel:
        stub = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        resp = await stub.GetRateLimits(tls_request(key, behavior, hits), timeout=5)
    r: pb.RateLimitResp = resp.responses[0]
    return r


def server_flags(certs: Certs, cert: str = "gubernator") -> tuple[str, ...]:
    return (
        "--tls-ca",
        certs.ca_cert,
        "--tls-cert",
        f"{certs.dir}/{cert}.pem",
        "--tls-key",
        f"{certs.dir}/{cert}.key",
    )


SETUP_CASES: dict[str, tuple[tuple[str, ...], str, str, list[tuple[str, Any]]]] = {
    # name: (server flags beyond the CA, client cert, expected server name override)
    "user provided certificates": ((), "", "", []),
    "user provided certificate without IP SANs": (
        ("--tls-client-auth-server-name", "gubernator"),
        "",
        "gubernator_no_ip_san",
        [("grpc.ssl_target_name_override", "gubernator")],
    ),
    "generate server certs with user provided ca": (("--tls-auto",), "", "", []),
    "client auth enabled": (
        ("--tls-auto", "--tls-client-auth", "require-and-verify"),
        "gubernator",
        "",
        [],
    ),
}


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("case", list(SETUP_CASES))
async def test_TestSetupTLS(tmp_path: Path, certs: Certs, case: str, server: str) -> None:
    extra, client_cert, server_cert, options = SETUP_CASES[case]
    if "--tls-auto" in extra:
        flags: tuple[str, ...] = ("--tls-ca", certs.ca_cert, "--tls-ca-key", certs.ca_key)
    else:
        flags = server_flags(certs, server_cert or "gubernator")
    with cluster_nodes(tmp_path, "--grpc-server", server, *flags, *extra) as nodes:
        r = await make_request(nodes[0].grpc_address, credentials(certs, client_cert), options)
        assert (r.error, r.status, r.remaining) == ("", pb.UNDER_LIMIT, 99)
        assert "TLS" in nodes[0].proc.log()


def unverified_context(cert: Certs | None = None, name: str = "") -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(f"{cert.dir}/{name}.pem", f"{cert.dir}/{name}.key")
    return context


async def https_rate_limit(port: int, context: ssl.SSLContext) -> dict[str, Any]:
    body = {
        "requests": [
            {
                "name": "test_tls",
                "unique_key": "account:995",
                "hits": 1,
                "limit": 100,
                "duration": 30_000,
            }
        ]
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"https://127.0.0.1:{port}/v1/GetRateLimits", json=body, ssl=context) as resp,
    ):
        assert resp.status == 200
        data: dict[str, Any] = json.loads(await resp.text())
        return data


async def test_TestSetupTLS_auto_tls(tmp_path: Path) -> None:
    """``auto tls``: a CA and a server certificate made at start, for 127.0.0.1."""
    with cluster_nodes(tmp_path, "--tls-auto") as nodes:
        data = await https_rate_limit(nodes[0].http_port, unverified_context())
        assert int(data["responses"][0]["remaining"]) == 99
        pem = ssl.get_server_certificate(("127.0.0.1", nodes[0].http_port))
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(pem.encode())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "127.0.0.1" in [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
        assert "localhost" in san.get_values_for_type(x509.DNSName)
        assert "AutoTLS Enabled" in nodes[0].proc.log()


async def test_TestSetupTLSSkipVerify(tmp_path: Path, certs: Certs) -> None:
    """A client that skips verification talks to a node with user-provided certificates."""
    with cluster_nodes(tmp_path, *server_flags(certs)) as nodes:
        data = await https_rate_limit(nodes[0].http_port, unverified_context())
        assert int(data["responses"][0]["remaining"]) == 99


@pytest.mark.parametrize("server", SERVERS)
async def test_TestSetupTLSClientAuth(tmp_path: Path, certs: Certs, server: str) -> None:
    flags = (
        *server_flags(certs),
        "--tls-client-auth",
        "require-and-verify",
        "--tls-client-auth-ca-cert",
        f"{certs.dir}/client-auth-ca.pem",
    )
    with cluster_nodes(tmp_path, "--grpc-server", server, *flags) as nodes:
        address = nodes[0].grpc_address
        # a certificate signed by another CA than the client-auth one is refused
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await make_request(address, credentials(certs, "gubernator"))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # so is no certificate at all
        with pytest.raises(grpc.aio.AioRpcError):
            await make_request(address, credentials(certs))
        r = await make_request(address, credentials(certs, "client-auth"))
        assert (r.error, r.remaining) == ("", 99)


@pytest.mark.parametrize("server", SERVERS)
async def test_plaintext_client_refused(tmp_path: Path, certs: Certs, server: str) -> None:
    with cluster_nodes(tmp_path, "--grpc-server", server, *server_flags(certs)) as nodes:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await make_request(nodes[0].grpc_address, None)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(aiohttp.ClientError):
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{nodes[0].http_port}/v1/HealthCheck") as resp,
            ):
                await resp.read()


def owned_by(nodes: list[Node], owner: int, prefix: str) -> str:
    from smockron.core.hashring import HashRing

    ring = HashRing([n.grpc_address for n in nodes])
    for i in range(1000):
        key = f"{prefix}{i}"
        if ring.owner(f"test_tls_{key}") == nodes[owner].grpc_address:
            return key
    raise AssertionError("no key found")


async def test_TestTLSClusterWithClientAuthentication(tmp_path: Path, certs: Certs) -> None:
    """Two nodes requiring verified client certificates forward to each other and sync
    GLOBAL limits over TLS, showing their server certificate as the client one."""
    flags = (
        *server_flags(certs),
        "--tls-client-auth",
        "require-and-verify",
        "--global-sync-wait",
        "20ms",
    )
    with cluster_nodes(tmp_path, *flags, nodes=2) as nodes:
        creds = credentials(certs, "gubernator")
        key = owned_by(nodes, 1, "fwd")
        r = await make_request(nodes[0].grpc_address, creds, key=key)
        assert (r.error, r.remaining) == ("", 99)
        assert r.metadata["owner"] == nodes[1].grpc_address
        key = owned_by(nodes, 1, "glob")
        r = await make_request(nodes[0].grpc_address, creds, key=key, behavior=pb.GLOBAL)
        assert (r.error, r.remaining) == ("", 99)
        seen = -1
        for _ in range(100):  # the hit taken on node 0 reaches its owner over TLS
            r = await make_request(
                nodes[1].grpc_address, creds, key=key, behavior=pb.GLOBAL, hits=0
            )
            seen = r.remaining
            if seen == 99:
                break
            await asyncio.sleep(0.05)
        assert seen == 99
        assert f"peer {nodes[1].grpc_address}:" not in nodes[0].proc.log()  # no call failed
        # the peer port (gRPC + 1) asks what the gRPC port asks: a client certificate
        peer_port = peer_address_of(nodes[0].grpc_address)
        check = peers_pb2.GetPeerRateLimitsReq(requests=tls_request("peer").requests)
        async with grpc.aio.secure_channel(peer_port, credentials(certs)) as channel:
            stub: Any = peers_pb2_grpc.PeersV1Stub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetPeerRateLimits(check, timeout=5)
        async with grpc.aio.secure_channel(peer_port, creds) as channel:
            stub = peers_pb2_grpc.PeersV1Stub(channel)  # type: ignore[no-untyped-call]
            resp = await stub.GetPeerRateLimits(check, timeout=5)
        assert (resp.rate_limits[0].error, resp.rate_limits[0].remaining) == ("", 99)


async def test_TestHTTPSClientAuth(tmp_path: Path, certs: Certs) -> None:
    """Client certificates required on the HTTPS gateway, not on the status listener."""
    (status_port,) = free_ports(1)
    flags = (
        *server_flags(certs),
        "--tls-client-auth",
        "require-and-verify",
        "--status-http-address",
        f"127.0.0.1:{status_port}",
    )
    with cluster_nodes(tmp_path, *flags) as nodes:
        wait_port(status_port)
        url = f"https://127.0.0.1:{nodes[0].http_port}/v1/HealthCheck"
        status_url = f"https://127.0.0.1:{status_port}/v1/HealthCheck"
        with_cert = ssl.create_default_context(cafile=certs.ca_cert)
        with_cert.load_cert_chain(f"{certs.dir}/gubernator.pem", f"{certs.dir}/gubernator.key")
        without_cert = ssl.create_default_context(cafile=certs.ca_cert)
        healths = []
        async with aiohttp.ClientSession() as session:
            async with session.get(status_url, ssl=without_cert) as resp:
                assert resp.status == 200
                healths.append(await resp.json())
            with pytest.raises(aiohttp.ClientError):
                async with session.get(url, ssl=without_cert) as resp:
                    await resp.read()
            async with session.get(url, ssl=with_cert) as resp:
                assert resp.status == 200
                healths.append(await resp.json())
            async with session.get(
                status_url.replace("HealthCheck", "LiveCheck"), ssl=without_cert
            ) as resp:
                assert resp.status == 404  # the status listener serves HealthCheck only
        for health in healths:
            assert health["status"] == "healthy"
            assert health["advertise_address"] == nodes[0].grpc_address
        log = nodes[0].proc.log()
        assert f"HTTPS Gateway Listening on 127.0.0.1:{nodes[0].http_port}" in log
        assert f"HTTPS Status Handler Listening on 127.0.0.1:{status_port}" in log


@pytest.mark.parametrize("server", ["native", "threads"])
async def test_verify_cert_accepts_no_certificate(
    tmp_path: Path, certs: Certs, server: str
) -> None:
    """GUBER_TLS_CLIENT_AUTH=verify-cert: a client without a certificate is served."""
    flags = (*server_flags(certs), "--tls-client-auth", "verify-cert")
    with cluster_nodes(tmp_path, "--grpc-server", server, *flags) as nodes:
        r = await make_request(nodes[0].grpc_address, credentials(certs))
        assert r.remaining == 99
        data = await https_rate_limit(
            nodes[0].http_port, ssl.create_default_context(cafile=certs.ca_cert)
        )
        assert int(data["responses"][0]["remaining"]) == 98
        warned = "cannot ask for a client certificate" in nodes[0].proc.log()
        assert warned == (server != "native")


async def test_guber_tls_environment(
    tmp_path: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUBER_TLS_CA", certs.ca_cert)
    monkeypatch.setenv("GUBER_TLS_CERT", f"{certs.dir}/gubernator.pem")
    monkeypatch.setenv("GUBER_TLS_KEY", f"{certs.dir}/gubernator.key")
    monkeypatch.setenv("GUBER_TLS_CLIENT_AUTH", "require-and-verify")
    with cluster_nodes(tmp_path) as nodes:
        with pytest.raises(grpc.aio.AioRpcError):
            await make_request(nodes[0].grpc_address, credentials(certs))
        r = await make_request(nodes[0].grpc_address, credentials(certs, "gubernator"))
        assert r.remaining == 99


def envoy_front(tmp: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    """The flags of an Envoy front (one request a minute), and envoyproxy/ratelimit's
    variables for TLS with client certificates from client-auth-ca."""
    (tmp / "edge.yaml").write_text(
        "domain: edge\ndescriptors:\n  - key: generic_key\n    value: slowpath\n"
        "    rate_limit: {unit: minute, requests_per_unit: 1}\n"
    )
    monkeypatch.setenv("GRPC_SERVER_USE_TLS", "true")
    monkeypatch.setenv("GRPC_SERVER_TLS_CERT", f"{certs.dir}/gubernator.pem")
    monkeypatch.setenv("GRPC_SERVER_TLS_KEY", f"{certs.dir}/gubernator.key")
    monkeypatch.setenv("GRPC_CLIENT_TLS_CACERT", f"{certs.dir}/client-auth-ca.pem")
    return ("--envoy-config", str(tmp / "edge.yaml"))


async def should_rate_limit(address: str, creds: grpc.ChannelCredentials) -> str:
    """The Envoy front's answer (OK, OVER_LIMIT) or the call's status code."""
    from smockron.cluster.envoy.pb import ratelimit_pb2, rls_pb2, rls_pb2_grpc

    descriptor = ratelimit_pb2.RateLimitDescriptor()
    descriptor.entries.add(key="generic_key", value="slowpath")
    request = rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor], hits_addend=1)
    async with grpc.aio.secure_channel(address, creds) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            resp = await stub.ShouldRateLimit(request, timeout=5)
        except grpc.aio.AioRpcError as exc:
            return str(exc.code().name)
    return str(rls_pb2.RateLimitResponse.Code.Name(resp.overall_code))


async def test_envoy_front_on_tls_from_ratelimit_variables(
    tmp_path: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = envoy_front(tmp_path, certs, monkeypatch)
    with cluster_nodes(tmp_path, *flags) as nodes:
        address = nodes[0].grpc_address
        codes = []
        for creds in (credentials(certs), *[credentials(certs, "client-auth")] * 2):
            codes.append(await should_rate_limit(address, creds))
    assert codes == ["UNAVAILABLE", "OK", "OVER_LIMIT"]


@pytest.mark.parametrize("server", SERVERS)
async def test_Test_mTLS(
    tmp_path: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch, server: str
) -> None:
    """envoyproxy/ratelimit's Test_mTLS: GRPC_CLIENT_TLS_SAN=localhost and a client
    certificate for localhost from the client CA. And what the setting is for: a
    certificate from that CA without the name is refused (UNAVAILABLE, as a refused
    handshake), so is none; a refusal is counted and logged with Go's reason."""
    flags = envoy_front(tmp_path, certs, monkeypatch)
    monkeypatch.setenv("GRPC_CLIENT_TLS_SAN", "localhost")
    good, other = credentials(certs, "client-auth-localhost"), credentials(certs, "client-auth")
    with cluster_nodes(tmp_path, "--grpc-server", server, *flags) as nodes:
        address = nodes[0].grpc_address
        codes = [await should_rate_limit(address, c) for c in (good, other, credentials(certs))]
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # every service of the port
            await make_request(address, other)
        r = await make_request(address, good)
        context = ssl.create_default_context(cafile=certs.ca_cert)
        context.load_cert_chain(*(f"{certs.dir}/client-auth-localhost.{x}" for x in ("pem", "key")))
        url = f"https://127.0.0.1:{nodes[0].http_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as resp:
            metrics = await resp.text()
        log = nodes[0].proc.log()
    assert codes == ["OK", "UNAVAILABLE", "UNAVAILABLE"]
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (r.error, r.remaining) == ("", 99)
    assert "smockron_cluster_tls_client_san_refused_total 2.0" in metrics
    assert "error validating client: x509: certificate is valid for client, not localhost" in log
    assert "GRPC_CLIENT_TLS_SAN" in log


@pytest.mark.parametrize(("flags", "served"), [((), False), (("--tls-min-version", "1.2"), True)])
async def test_min_version_on_the_http_gateway(
    tmp_path: Path, certs: Certs, flags: tuple[str, ...], served: bool
) -> None:
    """GUBER_TLS_MIN_VERSION (default 1.3, as upstream): a TLS 1.2 client is refused."""
    tls12 = ssl.create_default_context(cafile=certs.ca_cert)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    with cluster_nodes(tmp_path, *server_flags(certs), *flags) as nodes:
        if served:
            data = await https_rate_limit(nodes[0].http_port, tls12)
            assert int(data["responses"][0]["remaining"]) == 99
        else:
            with pytest.raises(aiohttp.ClientError):
                await https_rate_limit(nodes[0].http_port, tls12)


@pytest.mark.parametrize("server", SERVERS)
async def test_TestReloadTLS(tmp_path: Path, certs: Certs, server: str) -> None:
    """SIGHUP reads the certificate files again: new connections get the new certificate;
    a file that does not load keeps the old one."""
    other_ca, other_ca_key = tlsgen.make_ca("other")
    (tmp_path / "other-ca.pem").write_bytes(other_ca)
    cert, key = tmp_path / "node.pem", tmp_path / "node.key"
    cert.write_bytes(certs.read("gubernator.pem"))
    key.write_bytes(certs.read("gubernator.key"))
    flags = ("--grpc-server", server, "--tls-cert", str(cert), "--tls-key", str(key))
    old = credentials(certs)
    new = grpc.ssl_channel_credentials(root_certificates=other_ca)
    with cluster_nodes(tmp_path, *flags) as nodes:
        node = nodes[0]
        assert (await make_request(node.grpc_address, old)).remaining == 99
        # a broken file: the node keeps its certificate
        cert.write_text("not a certificate")
        node.proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "Keeping old TLS certificate" in node.proc.log(), 5)
        assert (await make_request(node.grpc_address, old)).remaining == 98
        # a certificate from another CA
        cert_pem, key_pem = tlsgen.make_cert(other_ca, other_ca_key, ["127.0.0.1"])
        key.write_bytes(key_pem)
        cert.write_bytes(cert_pem)
        node.proc.popen.send_signal(signal.SIGHUP)
        remaining = None
        for _ in range(60):  # the native server's file watcher looks every second
            try:
                remaining = (await make_request(node.grpc_address, new)).remaining
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
        assert remaining == 97
        with pytest.raises(grpc.aio.AioRpcError):
            await make_request(node.grpc_address, old)
        https = ssl.create_default_context(cafile=str(tmp_path / "other-ca.pem"))
        data = await https_rate_limit(node.http_port, https)
        assert int(data["responses"][0]["remaining"]) == 96


async def test_reload_renews_peer_channels(tmp_path: Path, certs: Certs) -> None:
    """After a reload a node calls its peers on new channels, showing the new certificate."""
    ca_key = certs.read("ca.key")
    cert, key = tmp_path / "node.pem", tmp_path / "node.key"
    cert.write_bytes(certs.read("gubernator.pem"))
    key.write_bytes(certs.read("gubernator.key"))
    flags = (
        "--tls-ca",
        certs.ca_cert,
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--tls-client-auth",
        "require-and-verify",
    )
    creds = credentials(certs, "gubernator")
    with cluster_nodes(tmp_path, *flags, nodes=2) as nodes:
        key_name = owned_by(nodes, 1, "reload")
        r = await make_request(nodes[0].grpc_address, creds, key=key_name)
        assert (r.error, r.metadata["owner"]) == ("", nodes[1].grpc_address)
        cert_pem, key_pem = tlsgen.make_cert(certs.read("ca.cert"), ca_key, ["127.0.0.1"])
        key.write_bytes(key_pem)
        cert.write_bytes(cert_pem)
        nodes[0].proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloading TLS certificate" in nodes[0].proc.log(), 5)
        for remaining in (98, 97):
            r = await make_request(nodes[0].grpc_address, creds, key=key_name)
            assert (r.error, r.remaining, r.metadata["owner"]) == (
                "",
                remaining,
                nodes[1].grpc_address,
            )
        assert f"peer {nodes[1].grpc_address}:" not in nodes[0].proc.log()


def test_auto_tls_with_a_bad_ca_key(tmp_path: Path) -> None:
    from smockron.cluster import tls
    from smockron.cluster.config import ClusterConfig
    from smockron.errors import ConfigError

    (tmp_path / "ca.pem").write_bytes(tlsgen.make_ca()[0])
    (tmp_path / "ca.key").write_text("not a key")
    config = ClusterConfig(
        tls_auto=True, tls_ca=str(tmp_path / "ca.pem"), tls_ca_key=str(tmp_path / "ca.key")
    )
    with pytest.raises(ConfigError, match="while generating self signed server certs"):
        tls.load(config.validate())


def test_bad_tls_settings_stop_the_command(tmp_path: Path) -> None:
    """One line naming the problem, no traceback, exit status 1."""
    (port,) = free_ports(1)
    proc = run_smockron(
        [
            "cluster",
            "--grpc-address",
            f"127.0.0.1:{port}",
            "--http-address",
            "",
            "--tls-cert",
            str(tmp_path / "missing.pem"),
            "--tls-key",
            str(tmp_path / "k"),
        ],
        tmp_path / "node.log",
    )
    try:
        assert proc.popen.wait(timeout=30) == 1
    finally:
        proc.stop()
    log = proc.log()
    assert f"while reading GUBER_TLS_CERT '{tmp_path / 'missing.pem'}': No such file" in log
    assert "Traceback" not in log


def test_a_missing_key_file_is_called_missing(tmp_path: Path, certs: Certs) -> None:
    """The certificate is there, its key is not: the key's path, said to be missing."""
    from smockron.cluster import tls
    from smockron.cluster.config import ClusterConfig
    from smockron.errors import ConfigError

    missing = tmp_path / "missing-key.pem"
    config = ClusterConfig(
        grpc_address="127.0.0.1:1", tls_cert=f"{certs.dir}/gubernator.pem", tls_key=str(missing)
    )
    with pytest.raises(ConfigError, match=f"GUBER_TLS_KEY '{missing}': No such file"):
        tls.load(config.validate())


async def test_require_any_cert_on_the_native_server(tmp_path: Path, certs: Certs) -> None:
    """require-any-cert: some certificate must be shown, from any CA (the native server;
    the HTTP gateway verifies the certificates it is shown)."""
    flags = (*server_flags(certs), "--tls-client-auth", "require-any-cert")
    with cluster_nodes(tmp_path, "--grpc-server", "native", *flags) as nodes:
        with pytest.raises(grpc.aio.AioRpcError):
            await make_request(nodes[0].grpc_address, credentials(certs))
        r = await make_request(nodes[0].grpc_address, credentials(certs, "client-auth"))
        assert (r.error, r.remaining) == ("", 99)


async def test_client_san_with_verify_cert_on_the_native_server(
    tmp_path: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify-cert: a certificate shown must carry GRPC_CLIENT_TLS_SAN; a client that
    shows none is served (upstream's check has no verified chain to look at)."""
    flags = envoy_front(tmp_path, certs, monkeypatch)
    monkeypatch.setenv("GRPC_CLIENT_TLS_SAN", "localhost")
    monkeypatch.setenv("GUBER_TLS_CLIENT_AUTH", "verify-cert")
    with cluster_nodes(tmp_path, "--grpc-server", "native", *flags) as nodes:
        address = nodes[0].grpc_address
        codes = [
            await should_rate_limit(address, credentials(certs, name))
            for name in ("client-auth", "", "client-auth-localhost")
        ]
    assert codes == ["UNAVAILABLE", "OK", "OVER_LIMIT"]


def test_client_san_setting(certs: Certs, caplog: pytest.LogCaptureFixture) -> None:
    """GRPC_CLIENT_TLS_SAN is read with envoyproxy/ratelimit's other TLS variables, and
    checked only where client certificates are verified (upstream: with a client CA)."""
    from prometheus_client import CollectorRegistry, Counter

    from smockron.cluster import tls
    from smockron.cluster.config import ClusterConfig
    from smockron.cluster.guber_env import from_env
    from smockron.errors import ConfigError

    env = {
        "GRPC_SERVER_TLS_CERT": f"{certs.dir}/gubernator.pem",
        "GRPC_SERVER_TLS_KEY": f"{certs.dir}/gubernator.key",
        "GRPC_CLIENT_TLS_SAN": "localhost",
    }
    assert from_env(env).tls_client_san == ""  # GRPC_SERVER_USE_TLS is off
    config = from_env({**env, "GRPC_SERVER_USE_TLS": "true"})
    assert config.tls_client_san == "localhost"
    with pytest.raises(ConfigError, match="no server certificate"):
        ClusterConfig(tls_client_san="localhost").validate()
    registry = CollectorRegistry()
    counter = Counter("san_refused", "test", registry=registry)
    assert tls.client_san_check(config, tls.load(config), counter) is None  # no client CA
    assert "GRPC_CLIENT_TLS_SAN=localhost is not checked" in caplog.text
    ca = f"{certs.dir}/client-auth-ca.pem"
    verified = from_env({**env, "GRPC_SERVER_USE_TLS": "true", "GRPC_CLIENT_TLS_CACERT": ca})
    check = tls.client_san_check(verified, tls.load(verified), counter)
    assert check is not None and check.required and check.wanted == "localhost"
    assert check.verify(["client"], []) is not None and check.verify(["localhost"], []) is None
    assert registry.get_sample_value("san_refused_total") == 1
