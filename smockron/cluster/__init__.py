"""The Gubernator-compatible cluster: gRPC and HTTP APIs, ring, batching, GLOBAL, discovery.

What a user imports is the client (:class:`Client`, :class:`AsyncClient`) and the types it
speaks, exactly :mod:`smockron.cluster.client`'s public names; the server is started by
``smockron cluster`` (:mod:`smockron.cluster.server`).
"""

from __future__ import annotations

from smockron.cluster import client as _client
from smockron.cluster.client import *  # noqa: F403

__all__ = _client.__all__
