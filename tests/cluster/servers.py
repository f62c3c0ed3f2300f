"""In-process cluster nodes for the cluster tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.static import StaticDiscovery
from smockron.cluster.server import ClusterServer


@contextlib.asynccontextmanager
async def serving(config: ClusterConfig) -> AsyncIterator[ClusterServer]:
    """A node of ``config``, its own only peer, started; stopped at the end."""
    server = ClusterServer(config, StaticDiscovery([config.grpc_address]))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
