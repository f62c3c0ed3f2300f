"""The native gRPC server (libgrpc++ through ``smockron.cluster._native``): bad input,
unknown methods, calls finished later from the event loop, cancellation, shutdown.

Skipped where the extension is not built (no libgrpc++ when the package was installed).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.cluster.server import GRPC_OPTIONS, ClusterServer
from smockron.cluster.transports import native
from smockron.cluster.transports.native import NativeServer
from tests.cluster.servers import serving
from tests.support import free_ports

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="_native extension not built")


@pytest.fixture
async def node() -> AsyncIterator[ClusterServer]:
    (g,) = free_ports(1)
    config = ClusterConfig(grpc_address=f"127.0.0.1:{g}", http_address="", grpc_server="native")
    async with serving(config) as server:
        yield server


def sample(server: ClusterServer, name: str, **labels: str) -> float:
    """A counter of this node's own registry, as its /metrics shows it."""
    return server.node.metrics.registry.get_sample_value(name, labels) or 0.0


@needs_native
async def test_garbage_and_unknown_methods_are_counted_and_serving_goes_on(
    node: ClusterServer,
) -> None:
    assert isinstance(node._grpc, NativeServer)
    async with grpc.aio.insecure_channel(node.config.grpc_address) as channel:
        raw = channel.unary_unary("/pb.gubernator.V1/GetRateLimits", None, None)
        for garbage in (b"\xff\xff\xff", b"\x0a\x05abc", bytes(range(256))):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await raw(garbage, timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for path in ("/pb.gubernator.V1/Nope", "/no.Such/Service", "/x"):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.unary_unary(path, None, None)(b"", timeout=5)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        req = pb.RateLimitReq(name="n", unique_key="k", hits=1, limit=5, duration=60_000)
        resp = await stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req]), timeout=5)
        assert resp.responses[0].remaining == 4
        health = await stub.HealthCheck(pb.HealthCheckReq(), timeout=5)  # asyncio handler
        assert health.status == "healthy"
    malformed = "smockron_cluster_grpc_malformed_total"
    assert sample(node, malformed, method="GetRateLimits") == 3  # a registry of its own
    assert sample(node, "smockron_cluster_grpc_unknown_method_total") == 3
    stats = node._grpc.stats()
    assert stats["calls"] >= 8 and stats["dispatch_errors"] == 0


@needs_native
async def test_forwarded_calls_are_finished_from_the_loop() -> None:
    """A check owned by the other node leaves the fast path (``bridge`` returns a Deferred)
    and is answered when the forward comes back; many at once need no gRPC thread each."""
    g1, g2 = free_ports(2)
    # forwards must not time out on a loaded machine: what is tested is the bridge, not
    # routing around a slow peer (a timed-out forward is answered by the sender instead)
    base = ClusterConfig(
        http_address="",
        grpc_server="native",
        peer_probe_interval_ms=50,
        batch_timeout_ms=5000,
        peer_down_after=1000,
    )
    ca, cb = (
        replace(base, grpc_address=f"127.0.0.1:{g1}"),
        replace(base, grpc_address=f"127.0.0.1:{g2}"),
    )
    a, b = ClusterServer(ca), ClusterServer(cb)
    peers = [PeerInfo(ca.grpc_address), PeerInfo(cb.grpc_address)]
    for server in (a, b):
        await server.start()
        server.node.set_peers(peers)
    try:
        ring = a.node.ring
        theirs = [
            k for k in (f"k{i}" for i in range(1000)) if ring.owner(f"n_{k}") == cb.grpc_address
        ]
        async with grpc.aio.insecure_channel(ca.grpc_address) as channel:
            stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]

            async def check(key: str) -> Any:
                req = pb.RateLimitReq(name="n", unique_key=key, hits=1, limit=5, duration=60_000)
                resp = await stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req]), timeout=5)
                return resp.responses[0]

            answers = await asyncio.gather(*(check(theirs[i % 10]) for i in range(300)))
        assert [r.error for r in answers if r.error] == []
        assert all(r.metadata["owner"] == cb.grpc_address for r in answers)
        # 30 hits on each of 10 keys of limit 5: 5 under, 25 over each
        assert sum(r.status == pb.UNDER_LIMIT for r in answers) == 50
    finally:
        await a.stop()
        await b.stop()


class Slow:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = asyncio.Event()

    async def LiveCheck(self, request: Any, context: Any) -> pb.LiveCheckResp:
        self.started.set()
        await self.release.wait()
        return pb.LiveCheckResp()


async def slow_server() -> tuple[NativeServer, Slow, str]:
    (port,) = free_ports(1)
    server = NativeServer(asyncio.get_running_loop())
    slow = Slow()
    handler = grpc.unary_unary_rpc_method_handler(
        slow.LiveCheck,
        request_deserializer=pb.LiveCheckReq.FromString,
        response_serializer=pb.LiveCheckResp.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("pb.gubernator.V1", {"LiveCheck": handler}),)
    )
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    return server, slow, f"127.0.0.1:{port}"


@needs_native
async def test_client_deadline_and_stop_with_a_call_in_progress() -> None:
    server, slow, address = await slow_server()
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.LiveCheck(pb.LiveCheckReq(), timeout=0.2)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        slow.release.set()  # the handler finishes a call that is gone: a no-op
        assert await stub.LiveCheck(pb.LiveCheckReq(), timeout=5) == pb.LiveCheckResp()
        slow.release.clear()
        pending = asyncio.ensure_future(stub.LiveCheck(pb.LiveCheckReq(), timeout=5))
        await asyncio.get_running_loop().run_in_executor(None, slow.started.wait, 5)
        await server.stop(0.2)  # grace runs out: the call is cancelled, stop returns
        with pytest.raises(grpc.aio.AioRpcError):
            await pending
    slow.release.set()
    assert server.stats()["outstanding"] == 0


@needs_native
async def test_cannot_bind_returns_zero() -> None:
    server, _, address = await slow_server()
    try:
        other = NativeServer(asyncio.get_running_loop(), GRPC_OPTIONS)  # no SO_REUSEPORT
        assert other.add_insecure_port(address) == 0
    finally:
        await server.stop(0)


@needs_native
def test_process_exits_cleanly_with_the_server_running() -> None:
    """Interpreter exit with a native server still serving (no stop): no crash, no hang."""
    (port,) = free_ports(1)
    script = textwrap.dedent(
        f"""
        import asyncio, grpc
        from smockron.cluster.config import ClusterConfig
        from smockron.cluster.server import GRPC_OPTIONS, ClusterServer
        from smockron.cluster.pb import gubernator_pb2 as pb

        async def main():
            config = ClusterConfig(grpc_address="127.0.0.1:{port}", http_address="",
                                   grpc_server="native")
            server = ClusterServer(config)
            await server.start()
            async with grpc.aio.insecure_channel(config.grpc_address) as channel:
                call = channel.unary_unary("/pb.gubernator.V1/LiveCheck")
                await call(pb.LiveCheckReq().SerializeToString(), timeout=5)
            print("served")

        asyncio.run(main())
        """
    )
    _served(script)


def _served(script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter; it must exit cleanly after printing "served"."""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "served" in done.stdout
    return done


def test_without_the_extension_the_node_falls_back_to_threads() -> None:
    """As on a machine without libgrpc++: ``native`` (the default) serves with ``threads``."""
    (port,) = free_ports(1)
    script = textwrap.dedent(
        f"""
        import asyncio, logging, os, sys
        sys.modules["smockron.cluster._native"] = None  # import fails, as when not built
        os.environ.pop("SMOCKRON_REQUIRE_COMPILED", None)  # and nothing requires it
        logging.basicConfig(level=logging.INFO)
        from smockron.cluster.transports import native
        from smockron.cluster.config import ClusterConfig
        from smockron.cluster.server import ClusterServer
        from smockron.cluster.transports.threaded import ThreadedServer
        import grpc
        from smockron.cluster.pb import gubernator_pb2 as pb

        async def main():
            assert not native.AVAILABLE
            config = ClusterConfig(grpc_address="127.0.0.1:{port}", http_address="")
            server = ClusterServer(config)
            await server.start()
            assert isinstance(server._grpc, ThreadedServer)
            assert server.config.grpc_server == "threads"  # the startup line's server=
            async with grpc.aio.insecure_channel(config.grpc_address) as channel:
                call = channel.unary_unary("/pb.gubernator.V1/LiveCheck")
                await call(pb.LiveCheckReq().SerializeToString(), timeout=5)
            await server.stop()
            print("served")

        asyncio.run(main())
        """
    )
    done = _served(script)
    assert done.stderr.count("native extension not built") == 1  # not once per listener
