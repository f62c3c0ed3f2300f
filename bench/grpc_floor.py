"""What one unary gRPC call costs on this machine before smockron does any work.

Run: python bench/grpc_floor.py [--seconds 3] [--runs 3]. Servers that answer every
GetRateLimits with the same bytes (no parsing, no rate limiting), each in its own
process, driven by bench/cluster.py's C++ load generator: grpc.aio (default loop and
uvloop), grpc.server with a thread pool of 1 and 8 workers, smockron's native transport
(smockron/cluster/_native.cc: libgrpc++ generic service, one Python call per request),
and a C++ server
(bench/loadgen/floor_server.cc). Pinned as in bench/cluster.py part 3 (server on CPU 1,
load generator on CPU 0). Prints medians: server CPU per call, p50/p99 at 2,000 calls/s.
This is the floor under bench/cluster.py's single-check figures (issue 5).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

from _common import median
from cluster import LOADGEN_DIR, NodeAddr, build_loadgen, loadgen_latency

from tests.support import free_port, wait_port

RESPONSE = bytes.fromhex("0a0a108094ebdc031805207b")  # limit 1e9, remaining 5, reset 123
VARIANTS = ("grpc.aio", "grpc.aio+uvloop", "grpc.server/1", "grpc.server/8", "native", "C++")


def serve(variant: str, port: int) -> None:
    """Run a constant-answer Python server (the child process's main)."""
    import grpc

    def handlers(fn: object) -> tuple[grpc.GenericRpcHandler, ...]:  # type: ignore[type-arg]
        method = grpc.unary_unary_rpc_method_handler(fn)  # type: ignore[arg-type]
        return (
            grpc.method_handlers_generic_handler("pb.gubernator.V1", {"GetRateLimits": method}),
        )

    if variant == "native":  # smockron's libgrpc++ transport, a Python dispatch per call
        import threading

        from smockron.cluster import _native  # type: ignore[attr-defined]

        def dispatch(call: object, method: str, data: bytes) -> None:
            call.finish(0, RESPONSE, "")  # type: ignore[attr-defined]

        keep = _native.Server(dispatch, f"127.0.0.1:{port}", [("grpc.so_reuseport", 0)])
        assert keep.port
        threading.Event().wait()
        return

    if variant.startswith("grpc.server/"):
        pool = futures.ThreadPoolExecutor(int(variant.split("/")[1]))
        server = grpc.server(pool, handlers=list(handlers(lambda req, ctx: RESPONSE)))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()
        return

    async def answer(req: bytes, ctx: object) -> bytes:
        return RESPONSE

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(handlers(answer))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    if variant.endswith("uvloop"):
        import uvloop

        uvloop.install()
    asyncio.run(main())


def build_floor_server() -> Path | None:
    exe = build_loadgen()  # also generates the protobuf sources
    if exe is None:
        return None
    out = LOADGEN_DIR / "build"
    server = out / "floor_server"
    source = LOADGEN_DIR / "floor_server.cc"
    if not server.exists() or server.stat().st_mtime < source.stat().st_mtime:
        flags = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "grpc++", "protobuf"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        subprocess.run(
            [
                "g++",
                "-O2",
                "-std=c++17",
                "-o",
                str(server),
                str(source),
                str(out / "gubernator.pb.cc"),
                str(out / "gubernator.grpc.pb.cc"),
                f"-I{out}",
                *flags,
                "-pthread",
            ],
            check=True,
        )
    return server


@contextlib.contextmanager
def running(variant: str, cxx: Path) -> Iterator[NodeAddr]:
    port = free_port()
    if variant == "C++":
        args = [str(cxx), str(port)]
    else:
        args = [sys.executable, __file__, "--serve", variant, str(port)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, 20)
        yield NodeAddr(f"127.0.0.1:{port}", 0, proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)


def main(seconds: float, runs: int, variants: tuple[str, ...] = VARIANTS) -> None:
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    exe, cxx = build_loadgen(), build_floor_server()
    if exe is None or cxx is None:
        sys.exit("needs protoc, grpc_cpp_plugin, g++ and libgrpc++-dev (see docs/cluster.md)")
    print(f"constant-answer gRPC servers, pinned, 2,000 calls/s, {runs} runs x {seconds}s")
    for variant in variants:
        got = []
        for _ in range(runs):
            with running(variant, cxx) as node:
                got.append(loadgen_latency(exe, node, 2000, seconds, pinned=True))
        p99s = ", ".join(f"{g['p99']:.2f}" for g in got)
        print(
            f"{variant:16} server CPU {median([g['server_us'] for g in got]):4.0f} us/call, "
            f"idle round trip {median([g['seq_p50'] for g in got]):.3f} ms, "
            f"p50 {median([g['p50'] for g in got]):.3f} ms, "
            f"p99 {median([g['p99'] for g in got]):.3f} ms [{p99s}]"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    parser.add_argument("--serve", nargs=2, metavar=("VARIANT", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
    else:
        main(args.seconds, args.runs, tuple(args.variants.split(",")))
