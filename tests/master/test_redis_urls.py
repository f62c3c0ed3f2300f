"""``redis+sentinel://`` and ``redis+cluster://``: parsed as the ``limits`` library names
them, and used against a real Sentinel and a real 3-node Redis Cluster."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from smockron.core.rules import Rule
from smockron.errors import ConfigError
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores import MemoryStore, Scope, open_store, parse_store_uri
from smockron.master.stores.redis import ClusterRedisStore, RedisStore
from smockron.master.stores.uri import redacted
from smockron.wire.codec import ACCEPTED, encode_accounting
from tests.support import RedisServer, wait_for, wait_port

T0 = 1_700_000_000_000
POLICIES = {"api": DomainPolicy((Rule(1.0, 3),))}


def test_parse_sentinel_and_cluster() -> None:
    s = parse_store_uri("redis+sentinel://:pw@h1:26379,h2/mymaster/2")
    assert (s.hosts, s.service, s.db, s.password) == (
        (("h1", 26379), ("h2", 26379)),
        "mymaster",
        2,
        "pw",
    )
    c = parse_store_uri("redis+cluster://n1:7000,n2:7001")
    assert c.scheme == "redis+cluster" and c.hosts == (("n1", 7000), ("n2", 7001))
    for bad in (
        "redis+sentinel://h1:26379",  # no service
        "redis+sentinel://h1:x/m",  # port
        "redis+sentinel://h1,,h2/m",  # empty host
        "redis+cluster://h1:7000/0",  # a cluster has no db
        "redis+cluster://h1:7000?layout=original",
        "redis+sentinel://h1/m/zero",
    ):
        with pytest.raises(ConfigError):
            parse_store_uri(bad)
    assert redacted("redis+sentinel://:secret@h1/m") == "redis+sentinel://:***@h1/m"
    assert redacted("redis://h:1/0") == "redis://h:1/0"


async def drive(store: RedisStore | MemoryStore, idents: list[bytes], now: int) -> int:
    """One batch of 4 requests per identifier; how many DELAY_UNTILs."""
    eng = Engine(POLICIES, store)
    store.tick(now)
    batch = [encode_accounting("api", ACCEPTED, i, now) for i in idents for _ in range(4)]
    decoded = eng.decode(batch)
    await store.load(eng.touched(decoded))
    out = eng.apply(decoded, now)
    await store.flush()
    return len(out)


def _port_pair() -> int:
    """A port P free along with P + 10000 (a cluster node's bus port), above the
    blocks of ``tests.support.free_ports``."""
    for _ in range(200):
        port = random.randrange(26000, 32000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


@pytest.fixture
def sentinel(redis_server: RedisServer, tmp_path: Path) -> Iterator[str]:
    """A real Sentinel (``redis-server --sentinel``) watching ``redis_server`` as mymaster."""
    port = _port_pair()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor mymaster 127.0.0.1 {redis_server.port} 1\n"
    )
    proc = subprocess.Popen(
        ["redis-server", str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port)
        yield f"redis+sentinel://127.0.0.1:{port}/mymaster/0"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[int]]:
    """Three real redis-server processes made one Redis Cluster (no replicas)."""
    ports: list[int] = []
    procs = []
    try:
        for _ in range(3):
            port = _port_pair()
            workdir = tmp_path / str(port)
            workdir.mkdir()
            procs.append(
                subprocess.Popen(
                    [
                        "redis-server",
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--dir",
                        str(workdir),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--protected-mode",
                        "no",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            ports.append(port)
        for port in ports:
            wait_port(port)
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )

        def ok() -> bool:
            for port in ports:
                info = redis.Redis(port=port).cluster("info")
                if info.get("cluster_state") != "ok":
                    return False
            return True

        wait_for(ok, timeout=15, interval=0.1)
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


async def test_sentinel_store_writes_to_the_master_it_names(
    sentinel: str, redis_server: RedisServer
) -> None:
    store = open_store(sentinel)
    assert isinstance(store, RedisStore)
    try:
        assert await store.ping()
        fresh = await drive(MemoryStore(), [b"abuser"], T0)
        assert 0 < fresh < 4
        assert await drive(store, [b"abuser"], T0) == fresh
    finally:
        await store.close()
    direct = redis.Redis(port=redis_server.port)
    keys: list[bytes] = direct.keys("smockron:*")  # type: ignore[assignment]
    assert [k for k in keys if k.endswith(b":abuser")]
    again = open_store(sentinel)  # a restarted master: the debt is read back
    assert isinstance(again, RedisStore)
    try:
        assert await drive(again, [b"abuser"], T0 + 100) == 4 > fresh
    finally:
        await again.close()


@pytest.mark.slow
async def test_cluster_store_spreads_keys_and_reads_them_back(cluster: list[int]) -> None:
    started = time.monotonic()
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in cluster[:2])
    store = open_store(url)
    assert isinstance(store, ClusterRedisStore)
    idents = [b"client-%d" % i for i in range(60)]
    try:
        assert await store.ping()
        fresh = await drive(MemoryStore(), idents, T0)
        assert await drive(store, idents, T0) == fresh  # one batch: keys of every slot
    finally:
        await store.close()
    held = [redis.Redis(port=p).dbsize() for p in cluster]
    assert sum(held) == 60 and all(held), held  # spread over the three nodes
    again = open_store(url)
    assert isinstance(again, ClusterRedisStore)
    try:
        assert await drive(again, idents, T0 + 100) == 240 > fresh  # everyone still owes
    finally:
        await again.close()
    assert time.monotonic() - started < 15


async def test_cluster_store_lists_live_states_from_every_primary(cluster: list[int]) -> None:
    """RESYNC's listing walks each primary's keyspace (a SCAN answers for one node only)
    and reads values across slots."""
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in cluster[:1])
    rule = Rule(1 / 60, 1)  # a debt that outlives the test
    scope = Scope("api", rule, "history")
    idents = [b"client-%d" % i for i in range(300)]
    now = time.time() * 1000
    writer = open_store(url)
    try:
        eng = Engine({"api": DomainPolicy((rule,), "history")}, writer)
        writer.tick(now)
        batch = [encode_accounting("api", ACCEPTED, i, int(now)) for i in idents]
        eng.apply(eng.decode(batch), now)
        await writer.flush(wait=True)
    finally:
        await writer.close()
    nodes = [redis.Redis(port=p) for p in cluster]
    keys: list[list[bytes]] = [n.keys("smockron:*") for n in nodes]  # type: ignore[misc]
    assert sum(map(len, keys)) == 300 and min(map(len, keys)) > 50  # every primary a share
    slots = {nodes[0].cluster("keyslot", k) for held in keys for k in held}
    assert len(slots) > 250  # spread over the slot space, not gathered by hash tags
    reader = open_store(url)  # a restarted master: nothing in memory
    try:
        states = await reader.live(scope, 1000)
        assert sorted(i for i, _ in states) == sorted(idents)
        assert all(state for _, state in states)
        assert len(await reader.live(scope, 7)) == 7  # bounded
        some = await reader.live(scope, 120)  # bounded across nodes
        assert len({i for i, _ in some}) == 120
        assert await reader.live(Scope("other", rule, "history"), 10) == []
        assert isinstance(reader, ClusterRedisStore) and reader.available()
    finally:
        await reader.close()
