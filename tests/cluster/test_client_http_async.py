"""AsyncClient's HTTP/1.1 transport on a running event loop, asyncio's and uvloop's.

test_client_http.py runs its node, fake-gateway and hostile-answer tests for the
AsyncClient as well; here is what only a loop that keeps running shows: concurrent
tasks on the pool, a connection the server closed while idle noticed and replaced,
a cancelled call dropping its connection, ``close`` during a call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import grpc
import pytest

from smockron.cluster.client import (
    MINUTE,
    SECOND,
    AsyncClient,
    ClientError,
    ClientTimeout,
    ClientUnavailable,
    Status,
)
from tests.cluster.test_client_http import (
    GOOD,
    HOSTILE,
    FakeGateway,
    NodeProc,
    established,
    http,
    node,  # noqa: F401 (a fixture)
    same,
)
from tests.support import wait_for

Loop = Literal["asyncio", "uvloop"]
loops = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])


def run(loop: Loop, main: Callable[[], Awaitable[None]]) -> None:
    """``main()`` on a fresh loop of the kind asked for."""
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(main())
    else:
        asyncio.run(main())  # type: ignore[arg-type]


@loops
def test_answers_and_keep_alive_on_a_running_loop(node: NodeProc, loop: Loop) -> None:  # noqa: F811
    """Sequential checks share one connection with gRPC's count; concurrent uncoalesced
    tasks take a connection each, all counted once, and the pool keeps them."""
    name = "ha_" + loop
    before = established(node.http_port)

    async def main() -> None:
        async with (
            AsyncClient(node.grpc_address, http_address=node.http_address) as by_http,
            AsyncClient(node.grpc_address, transport="grpc") as by_grpc,
            AsyncClient(node.grpc_address, http_address=node.http_address, coalesce=False) as lone,
        ):
            for i in range(10):
                client = by_http if i % 2 else by_grpc
                assert (await client.check(name, "k", 1, 5, MINUTE)).remaining == max(4 - i, 0)
            looks = [await c.check(name, "k", 0, 5, MINUTE) for c in (by_http, by_grpc)]
            assert same(looks[0]) == same(looks[1]) and looks[0].status is Status.UNDER_LIMIT
            assert by_http.http is not None and by_http.http.connections == 1
            for _ in range(3):
                got = await asyncio.gather(
                    *(lone.check(name, "c", 1, 1000, MINUTE) for _ in range(8))
                )
                assert all(r.error == "" for r in got)
            assert lone.http is not None and lone.http.connections == 8
            assert established(node.http_port) == before + 9
            assert (await lone.check(name, "c", 0, 1000, MINUTE)).remaining == 1000 - 24

    run(loop, main)
    wait_for(lambda: established(node.http_port) == before, timeout=5)


@loops
def test_server_closing_an_idle_connection_is_no_error(loop: Loop) -> None:
    """The server answers (as keep-alive) then closes: noticed before the next call,
    whether the loop ran meanwhile (it saw the end of stream) or not (a look at the
    socket), and replaced without an error."""
    gateway = FakeGateway(lambda _: http("200 OK", GOOD), close_after=True)

    async def main() -> None:
        async with AsyncClient("127.0.0.1:1", timeout=2, http_address=gateway.address) as c:
            for i in range(4):
                assert (await c.check("n", "k", 1, 5, SECOND)).status is Status.OVER_LIMIT
                if i % 2:
                    await asyncio.sleep(0.2)
                else:
                    time.sleep(0.2)  # the loop does not run
            assert c.http is not None and c.http.connections == 4

    try:
        run(loop, main)
        assert gateway.accepted == 4
    finally:
        gateway.close()


@loops
def test_cancelled_call_drops_its_connection(loop: Loop) -> None:
    """A caller gives up (wait_for) on a gateway that does not answer: its connection
    is closed, never reused with an answer still due; a timeout is a ClientTimeout."""
    answers = iter([None, http("200 OK", GOOD)])
    gateway = FakeGateway(lambda _: next(answers))

    async def main() -> None:
        async with AsyncClient("127.0.0.1:1", timeout=5, http_address=gateway.address) as c:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(c.check("n", "k", 1, 5, SECOND), 0.3)
            assert (await c.check("n", "k", 1, 5, SECOND)).status is Status.OVER_LIMIT
            assert c.http is not None and c.http.connections == 2

    try:
        run(loop, main)
    finally:
        gateway.close()


@loops
def test_timeout_and_close_during_a_call(loop: Loop) -> None:
    gateway = FakeGateway(lambda _: None)

    async def main() -> None:
        async with AsyncClient("127.0.0.1:1", timeout=0.5, http_address=gateway.address) as c:
            start = time.monotonic()
            with pytest.raises(ClientTimeout) as info:
                await c.check("n", "k", 1, 5, SECOND)
            assert time.monotonic() - start > 0.4
            assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
            call = asyncio.ensure_future(c.check("n", "k", 1, 5, SECOND, timeout=3))
            await asyncio.sleep(0.2)
            await c.close()
            with pytest.raises(ClientUnavailable, match="closed"):  # not its timeout
                await call
            with pytest.raises(ClientUnavailable, match="closed"):
                await c.check("n", "k", 1, 5, SECOND)

    try:
        run(loop, main)
    finally:
        gateway.close()


@loops
@pytest.mark.parametrize("name", ["endless_head", "huge_chunk", "deep_json", "two_lengths"])
def test_hostile_answers_on_uvloop_too(loop: Loop, name: str) -> None:
    gateway = FakeGateway(lambda _: HOSTILE[name])

    async def main() -> None:
        async with AsyncClient("127.0.0.1:1", timeout=3, http_address=gateway.address) as c:
            with pytest.raises(ClientError) as info:
                await c.check("n", "k", 1, 5, SECOND)
            assert info.value.code is grpc.StatusCode.INTERNAL
            assert "malformed response" in str(info.value) and len(str(info.value)) < 1000

    try:
        run(loop, main)
    finally:
        gateway.close()
