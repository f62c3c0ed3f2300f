"""What a user imports to call a cluster: the sync and asyncio clients over gRPC (grpcio,
or the optional native channel ``smockron.cluster._nativeclient``) or HTTP/1.1, and the
types they speak. Nothing here runs in a node; ``smockron.cluster`` re-exports these names.

- ``_client``: the names a user imports (``_sync``'s :class:`Client`, ``_async``'s
  :class:`AsyncClient`, the messages and errors); its docstring maps the rest;
- ``_routing``: the ring's copy and the one routing path both clients drive;
- ``_http``: the HTTP/1.1 transport (``POST /v1/GetRateLimits`` on kept-alive
  connections), over the pure codecs of ``_httpcodec``;
- ``_coalesce``: concurrent checks of one process batched into one call.
"""

from __future__ import annotations

from smockron.cluster.client import _client
from smockron.cluster.client._client import *  # noqa: F403

__all__ = _client.__all__
