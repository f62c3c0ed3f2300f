"""A Python client, sync and asyncio, for the Gubernator v2 ``pb.gubernator.V1`` gRPC API.

It speaks the wire Gubernator speaks, so the same code talks to a smockron cluster or to
Gubernator itself. Requests and responses are smockron.cluster.model values.

    with Client("127.0.0.1:1051") as client:
        resp = client.check("requests_per_sec", "account:42", 1, 100, SECOND)
        if resp.status is Status.OVER_LIMIT: ...

    async with AsyncClient(["10.0.0.1:1051", "10.0.0.2:1051"]) as client:
        resps = await client.get_rate_limits([RateLimitRequest(...), ...])

Each check goes to the node that owns its key (smockron.cluster.client._routing: the
ring learned from a node's HealthCheck, kept up to date), so no node forwards it; a
batch is split by owner, the parts sent in parallel. The given address(es) (several:
balanced round-robin) are where the node list is asked for, and where calls go while
no ring is known (Gubernator lists no peers) or no owner answers. ``route=False`` sends
everything to the given address(es), as Envoy or Gubernator's clients do.

Errors (all from smockron.errors.SmockronError):

    ClientError              the call as a whole failed; carries ``code`` and ``details``
     ├── ClientUnavailable   nobody answers at the address, or the connection broke
     ├── ClientTimeout       the deadline passed (also a TimeoutError)
     └── ItemError           ``check()`` only: the server answered this item with an error

``get_rate_limits`` never raises ItemError: per-item errors stay in each response's
``error``, as on the wire. Concurrent ``check`` calls (threads of one Client, tasks on
one AsyncClient's loop) are coalesced into one call while another is in flight
(smockron.cluster.client._coalesce; inside the native channel when a Client's checks all go
through it; ``coalesce=False`` turns it off; a check with its own ``timeout`` goes
alone). Lists longer than the server's limit of 1,000 per call are
split into several calls; the answers come back in request order.

Transport: when the optional extension smockron.cluster._nativeclient is built (it
needs libgrpc++, as the native server does) a plain-text client calls through it, at a
fraction of grpcio's CPU per call; otherwise, for TLS (``credentials``), or with
``native=False``, it calls through grpcio. Both send the same bytes (the generated
protobuf classes encode) and raise the same errors; ``client.native`` says which is in
use.

Either client given the node's HTTP gateway (``http_address``) sends lone checks, the
sequential caller's case, as ``POST /v1/GetRateLimits`` over a kept-alive HTTP/1.1
connection (smockron.cluster.client._http): less client CPU than a gRPC call.
Batches (``get_rate_limits``, coalesced checks) stay on gRPC, where protobuf costs less
per item than JSON; ``transport="http"`` sends them over HTTP too, ``transport="grpc"``
never uses HTTP. Same answers, same errors either way.

The modules behind the clients, each one concern: ``_sync`` (Client) and ``_async``
(AsyncClient), twins over ``_base`` (their shared arguments, channels and node clients);
``_routing`` (the ring's copy, and ``Route``: one call's way to its owners, both twins
drive it); ``_messages`` (the protobuf messages, built and read); ``_channel`` (targets,
native or grpcio, errors); ``_http`` (over ``_httpcodec``) and ``_coalesce``.
"""

from __future__ import annotations

from smockron.cluster.client._async import AsyncClient
from smockron.cluster.client._channel import NATIVE_AVAILABLE, grpc_target
from smockron.cluster.client._messages import (
    HOUR,
    MAX_BATCH_SIZE,
    MILLISECOND,
    MINUTE,
    SECOND,
    HealthCheck,
)
from smockron.cluster.client._sync import Client
from smockron.cluster.model import Algorithm, Behavior, RateLimitRequest, RateLimitResponse, Status
from smockron.errors import ClientError, ClientTimeout, ClientUnavailable, ItemError

# the model types are re-exported so one import gives a user everything (annotated: mypy
# cannot infer it through smockron.cluster's re-export)
__all__: list[str] = [
    "HOUR",
    "MAX_BATCH_SIZE",
    "MILLISECOND",
    "MINUTE",
    "NATIVE_AVAILABLE",
    "SECOND",
    "Algorithm",
    "AsyncClient",
    "Behavior",
    "Client",
    "ClientError",
    "ClientTimeout",
    "ClientUnavailable",
    "HealthCheck",
    "ItemError",
    "RateLimitRequest",
    "RateLimitResponse",
    "Status",
    "grpc_target",
]
