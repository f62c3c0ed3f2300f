"""Fixtures shared by every test: free ports, real servers, the CLI as a subprocess.

Servers (redis-server, etcd) are started by the fixtures on free loopback ports so that
tests can stop and restart them; nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from smockron import compiled
from tests.support import EtcdServer, RedisServer, start_etcd, start_redis

# Property tests check results, not time: hypothesis's default 200 ms deadline per example
# is a wall-clock bound that a loaded machine breaks (the fast tests are timing-free).
settings.register_profile("smockron", deadline=None)
settings.load_profile("smockron")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under ``SMOCKRON_REQUIRE_COMPILED=1`` (scripts/test) a compiled twin that is not
    built stops the run at once, with one message naming it and what builds it."""
    try:
        compiled.require()
    except compiled.MissingCompiled as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A fresh redis-server on a free port; ``.restart()`` keeps its data (AOF on)."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path_factory.mktemp("etcd"))
    try:
        yield server
    finally:
        server.stop()
