"""One real node in-process: the gRPC V1 API and the HTTP/JSON gateway's shapes and errors.

Every test runs against each gRPC server (``threads``, the default, ``asyncio``, and
``native`` where the libgrpc++ extension is built).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest

from smockron.cluster.config import ClusterConfig
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.cluster.server import ClusterServer
from smockron.cluster.transports import native
from tests.cluster.servers import serving
from tests.support import free_ports


class Node:
    def __init__(self, server: ClusterServer, channel: grpc.aio.Channel) -> None:
        self.server = server
        self.grpc_address = server.config.grpc_address
        self.http = f"http://{server.config.http_address}"
        self.stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]


SERVERS = ["threads", "asyncio", *(["native"] if native.AVAILABLE else [])]


@pytest.fixture(params=SERVERS)
async def node(request: pytest.FixtureRequest) -> AsyncIterator[Node]:
    g, h = free_ports(2)
    config = ClusterConfig(  # PeersV1 from this test, not a member (test_peer_gate.py)
        grpc_address=f"127.0.0.1:{g}",
        http_address=f"127.0.0.1:{h}",
        grpc_server=request.param,
        peer_check_address=False,
    )
    async with serving(config) as server:
        channel = grpc.aio.insecure_channel(config.grpc_address)
        try:
            yield Node(server, channel)
        finally:
            await channel.close(None)


async def post(node: Node, body: bytes | str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{node.http}/v1/GetRateLimits", data=body) as resp,
    ):
        text = await resp.text()
        return resp.status, json.loads(text)


async def test_grpc_counts_and_reports(node: Node) -> None:
    req = pb.RateLimitReq(name="api", unique_key="acct:1", hits=1, limit=3, duration=60_000)
    statuses = []
    for _ in range(4):
        resp = await node.stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req]))
        statuses.append((resp.responses[0].status, resp.responses[0].remaining))
    assert statuses == [
        (pb.UNDER_LIMIT, 2),
        (pb.UNDER_LIMIT, 1),
        (pb.UNDER_LIMIT, 0),
        (pb.OVER_LIMIT, 0),
    ]
    assert resp.responses[0].metadata["owner"] == node.grpc_address
    assert resp.responses[0].limit == 3


async def test_grpc_bad_item_gets_its_own_error(node: Node) -> None:
    reqs = [
        pb.RateLimitReq(name="a", unique_key="1", hits=1, limit=5, duration=1000),
        pb.RateLimitReq(name="a", unique_key="", hits=1, limit=5, duration=1000),
        pb.RateLimitReq(name="a", unique_key="2", hits=1, limit=5, duration=1000, algorithm=7),  # type: ignore[arg-type]
        pb.RateLimitReq(name="", unique_key="3", hits=1, limit=5, duration=1000),
        pb.RateLimitReq(name="a", unique_key="4", hits=2, limit=5, duration=1000),
    ]
    resp = await node.stub.GetRateLimits(pb.GetRateLimitsReq(requests=reqs))
    out = [(r.error, r.remaining) for r in resp.responses]
    assert out[0] == ("", 4)
    assert out[1] == ("field 'unique_key' cannot be empty", 0)
    assert out[2][0].startswith("invalid rate limit algorithm '7'")
    assert out[3] == ("field 'namespace' cannot be empty", 0)
    assert out[4] == ("", 3)


EXTREME = [
    {"hits": 1, "limit": 5, "duration": 2**63 - 1},
    {"hits": -(2**63), "limit": 5, "duration": 1000},
    {"hits": 1, "limit": 5, "duration": 1000, "created_at": -(2**63)},
    {"hits": 1, "limit": 2**63 - 1, "duration": 2**63 - 1, "created_at": 2**63 - 1},
]


@pytest.mark.parametrize("algorithm", [0, 1, 2, 3])
async def test_int64_extremes_never_fail_the_call(node: Node, algorithm: int) -> None:
    """Hostile but valid int64 values: each item answered in range, the call never fails."""
    reqs = [
        pb.RateLimitReq(name="x", unique_key=f"{algorithm}-{i}", algorithm=algorithm, **kw)  # type: ignore[arg-type]
        for i, kw in enumerate(EXTREME)
    ]
    reqs.append(pb.RateLimitReq(name="x", unique_key="fine", hits=1, limit=5, duration=1000))
    resp = await node.stub.GetRateLimits(pb.GetRateLimitsReq(requests=reqs))
    assert len(resp.responses) == len(reqs)
    assert (resp.responses[-1].error, resp.responses[-1].remaining) == ("", 4)
    if algorithm == 0:  # token bucket: window end and given-back hits saturate at int64
        assert resp.responses[0].reset_time == 2**63 - 1
        assert resp.responses[1].remaining == 2**63 - 1
    items = [
        {"name": "x", "unique_key": f"h{algorithm}-{i}", "algorithm": algorithm}
        | {k: str(v) for k, v in kw.items()}  # int64 as strings, as grpc-gateway sends them
        for i, kw in enumerate(EXTREME)
    ]
    body = {"requests": items}
    status, data = await post(node, json.dumps(body))
    assert status == 200
    assert len(data["responses"]) == len(EXTREME)
    for item in data["responses"]:
        for field in ("limit", "remaining", "reset_time"):
            assert -(2**63) <= int(item[field]) <= 2**63 - 1


async def test_grpc_more_than_1000_is_out_of_range(node: Node) -> None:
    req = pb.RateLimitReq(name="a", unique_key="k", hits=1, limit=5, duration=1000)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await node.stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req] * 1001))
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "max size is '1000'" in (info.value.details() or "")
    ok = await node.stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req] * 1000))
    assert len(ok.responses) == 1000


async def test_grpc_health_and_live(node: Node) -> None:
    health = await node.stub.HealthCheck(pb.HealthCheckReq())
    assert (health.status, health.peer_count, health.advertise_address) == (
        "healthy",
        1,
        node.grpc_address,
    )
    assert await node.stub.LiveCheck(pb.LiveCheckReq()) == pb.LiveCheckResp()


async def test_http_shapes_snake_case_zero_values_int64_strings(node: Node) -> None:
    body = {
        "requests": [
            {"name": "h", "uniqueKey": "camel", "hits": 1, "limit": 10, "duration": "60000"},
            {
                "name": "h",
                "unique_key": "snake",
                "hits": "0",
                "limit": 5,
                "duration": 1000,
                "algorithm": "LEAKY_BUCKET",
                "behavior": "NO_BATCHING",
            },
            {"name": "h", "unique_key": "", "hits": 1},
        ]
    }
    status, data = await post(node, json.dumps(body))
    assert status == 200
    first, second, third = data["responses"]
    assert set(first) == {"status", "limit", "remaining", "reset_time", "error", "metadata"}
    assert first["status"] == "UNDER_LIMIT"
    assert (first["limit"], first["remaining"]) == ("10", "9")
    assert isinstance(first["reset_time"], str) and int(first["reset_time"]) > 0
    assert first["error"] == ""
    assert first["metadata"] == {"owner": node.grpc_address}
    assert (second["limit"], second["remaining"]) == ("5", "5")
    assert third == {
        "status": "UNDER_LIMIT",
        "limit": "0",
        "remaining": "0",
        "reset_time": "0",
        "error": "field 'unique_key' cannot be empty",
        "metadata": {},
    }


async def test_http_health_live_metrics(node: Node) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{node.http}/v1/HealthCheck") as resp:
            assert resp.status == 200
            assert await resp.json() == {
                "status": "healthy",
                "message": "",
                "peer_count": 1,
                "advertise_address": node.grpc_address,
                "local_peers": [{"grpc_address": node.grpc_address, "data_center": ""}],
                "region_peers": [],
            }
        async with session.get(f"{node.http}/v1/LiveCheck") as resp:
            assert (resp.status, await resp.json()) == (200, {})
        await post(node, "{not json")
        async with session.get(f"{node.http}/metrics") as resp:
            text = await resp.text()
            assert 'smockron_cluster_http_malformed_total{reason="bad_json"}' in text
            assert "smockron_cluster_request_duration_seconds_bucket" in text


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"requests": [{"hits": "many"}]}', "invalid GetRateLimitsReq"),
        (b'{"requests": [{"algorithm": "QUANTUM"}]}', "invalid GetRateLimitsReq"),
        (b'{"requests": 5}', "invalid GetRateLimitsReq"),
    ],
)
async def test_http_malformed_json_is_400_and_server_keeps_serving(
    node: Node, body: bytes, fragment: str
) -> None:
    status, data = await post(node, body)
    assert status == 400
    assert data["code"] == 3 and fragment in data["message"]
    item = {"name": "x", "unique_key": body.hex(), "hits": 1, "limit": 2, "duration": 9000}
    ok_status, ok = await post(node, json.dumps({"requests": [item]}))
    assert ok_status == 200 and ok["responses"][0]["remaining"] == "1"


async def test_http_deeply_nested_json_is_400_not_500(node: Node) -> None:
    registry = node.server.node.metrics.registry
    labels = {"reason": "bad_json"}
    metric = "smockron_cluster_http_malformed_total"
    for body in ("[" * 100_000 + "]" * 100_000, '{"requests": [{"metadata": ' + '{"a": ' * 50_000):
        status, data = await post(node, body)
        assert status == 400
        assert data["code"] == 3 and "nested too deeply" in data["message"]
    assert registry.get_sample_value(metric, labels) == 2
    item = {"name": "x", "unique_key": "after-deep", "hits": 1, "limit": 2, "duration": 9000}
    ok_status, ok = await post(node, json.dumps({"requests": [item]}))
    assert ok_status == 200 and ok["responses"][0]["remaining"] == "1"


async def test_http_more_than_1000_items(node: Node) -> None:
    item = {"name": "x", "unique_key": "y", "hits": 0, "limit": 2, "duration": 1000}
    status, data = await post(node, json.dumps({"requests": [item] * 1001}))
    assert status == 400 and "max size is '1000'" in data["message"]


async def test_garbage_bytes_on_http_port(node: Node) -> None:
    host, port = node.server.config.http_address.split(":")
    for garbage in (
        b"\x16\x03\x01\x02\x00garbage\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
        b"\x00" * 64,
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(garbage)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
        await writer.wait_closed()
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0]
    item = {"name": "x", "unique_key": "z", "hits": 1, "limit": 2, "duration": 9000}
    status, _ = await post(node, json.dumps({"requests": [item]}))
    assert status == 200
    async with aiohttp.ClientSession() as session, session.get(f"{node.http}/metrics") as resp:
        assert 'smockron_cluster_http_malformed_total{reason="bad_http"} 3.0' in await resp.text()


async def test_garbage_on_grpc_port(node: Node) -> None:
    host, port = node.grpc_address.split(":")
    for garbage in (b"GET / HTTP/1.1\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(garbage)
        await writer.drain()
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(reader.read(4096), 2)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    # a well-framed call whose body is not a GetRateLimitsReq
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        raw = channel.unary_unary(
            "/pb.gubernator.V1/GetRateLimits",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await raw(b"\x0a\xff\xff\xff\xff\x0f garbage", timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    req = pb.RateLimitReq(name="g", unique_key="after", hits=1, limit=2, duration=9000)
    resp = await node.stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req]))
    assert resp.responses[0].remaining == 1
    async with aiohttp.ClientSession() as session, session.get(f"{node.http}/metrics") as mresp:
        assert 'smockron_cluster_grpc_malformed_total{method="GetRateLimits"}' in await mresp.text()


async def test_update_peer_globals_with_unknown_algorithm_is_counted_and_skipped(
    node: Node, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from smockron.cluster import node as node_module
    from smockron.cluster.pb import peers_pb2, peers_pb2_grpc

    # the log is rate-limited per process: start a fresh window (the other server's run)
    monkeypatch.setattr(node_module._bad_globals_log, "_windows", {})
    metric = "smockron_cluster_peer_globals_rejected_total"
    registry = node.server.node.metrics.registry  # the node's own: nothing counted before
    assert registry.get_sample_value(metric) == 0.0
    status = pb.RateLimitResp(limit=10, remaining=3, reset_time=2**40)
    bad = peers_pb2.UpdatePeerGlobal(key="g_bad", status=status, algorithm=99, duration=1000)  # type: ignore[arg-type]
    good = peers_pb2.UpdatePeerGlobal(key="g_good", status=status, algorithm=1, duration=1000)  # type: ignore[arg-type]
    async with grpc.aio.insecure_channel(node.server.config.peer_listen_address) as channel:
        peers: Any = peers_pb2_grpc.PeersV1Stub(channel)  # type: ignore[no-untyped-call]
        for _ in range(30):
            await peers.UpdatePeerGlobals(peers_pb2.UpdatePeerGlobalsReq(globals=[bad, good]))
    assert registry.get_sample_value(metric) == 30
    async with aiohttp.ClientSession() as session, session.get(f"{node.http}/metrics") as resp:
        assert f"{metric} 30.0" in (await resp.text()).splitlines()  # served on /metrics
    lines = [r for r in caplog.records if "unknown algorithm" in r.getMessage()]
    assert 1 <= len(lines) <= 2  # rate-limited: one line a second, not one per entry
    replicas = node.server.node.replicas
    assert "g_bad" not in replicas
    assert replicas.get("g_good") is not None and replicas.get("g_good").remaining == 3  # type: ignore[union-attr]
    req = pb.RateLimitReq(name="g", unique_key="still", hits=1, limit=2, duration=9000)
    resp = await node.stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req]))
    assert resp.responses[0].remaining == 1


async def test_multi_region_is_accepted_without_effect(node: Node) -> None:
    """MULTI_REGION (16) counts exactly like the same request without it, gRPC and HTTP."""

    def req(key: str, behavior: int) -> pb.RateLimitReq:
        return pb.RateLimitReq(
            name="mr",
            unique_key=key,
            hits=2,
            limit=5,
            duration=60_000,
            behavior=behavior,  # type: ignore[arg-type]
        )

    seen: dict[str, list[tuple[int, int, str]]] = {"plain": [], "multi": []}
    for _ in range(3):
        for key, behavior in (("plain", 0), ("multi", pb.MULTI_REGION)):
            resp = await node.stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req(key, behavior)]))
            r = resp.responses[0]
            seen[key].append((r.status, r.remaining, r.error))
    assert (
        seen["multi"]
        == seen["plain"]
        == [
            (pb.UNDER_LIMIT, 3, ""),
            (pb.UNDER_LIMIT, 1, ""),
            (pb.OVER_LIMIT, 1, ""),
        ]
    )
    item = {"name": "mr", "uniqueKey": "http", "hits": 1, "limit": 5, "duration": 60_000}
    for named in ("MULTI_REGION", pb.MULTI_REGION | pb.NO_BATCHING):
        status, data = await post(node, json.dumps({"requests": [item | {"behavior": named}]}))
        assert status == 200 and data["responses"][0]["error"] == ""
    assert data["responses"][0]["remaining"] == "3"


async def test_http_bad_input_cannot_forge_log_lines(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A client's bytes reach the log escaped: no newline, CR, ESC or NUL of theirs."""
    from smockron.cluster.transports import http

    http._bad_input_log._windows.clear()  # other tests' lines do not hold this one back
    evil = "QUANTUM\n2026-11-24 00:00:00 INFO forged line\r\x1b[31m\x00"
    body = json.dumps({"requests": [{"metadata": evil}]})  # protobuf echoes it raw
    with caplog.at_level(logging.WARNING):
        status, _data = await post(node, body)
    assert status == 400
    lines = [r.getMessage() for r in caplog.records if "bad request" in r.getMessage()]
    assert lines, caplog.records
    for line in lines:
        assert not any(c in line for c in "\n\r\x1b\x00"), line
    assert any("QUANTUM\\n2026-11-24" in line and "\\x1b[31m\\x00" in line for line in lines)
