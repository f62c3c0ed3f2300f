"""The cluster's request handling, whatever carries the call: the gRPC servicers
(service.py, on any of the three servers) and the HTTP gateway (http.py) both decode,
decide and answer through these functions, so a call means the same on every transport.

Each item is decoded on its own, so an item with (say) an unknown algorithm gets its own
``error`` while the rest of the call is answered; more than 1,000 items fail the whole
call with OUT_OF_RANGE and Gubernator's message (``TOO_MANY``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from google.protobuf.message import DecodeError

from smockron.cluster import convert
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.model import Behavior, RateLimitRequest, RateLimitResponse
from smockron.cluster.node import MAX_BATCH, Node
from smockron.cluster.pb import gubernator_pb2 as pb

_GLOBAL = int(Behavior.GLOBAL)
TOO_MANY = f"Requests.RateLimits list too large; max size is '{MAX_BATCH}'"
PEER_TOO_MANY = f"'PeerRequest.rate_limits' list too large; max size is '{MAX_BATCH}'"


def decode(
    msgs: Sequence[pb.RateLimitReq],
) -> tuple[list[RateLimitRequest], list[int], list[RateLimitResponse | None]]:
    """(valid requests, their indexes, per-index error responses for the others)."""
    valid: list[RateLimitRequest] = []
    indexes: list[int] = []
    errors: list[RateLimitResponse | None] = [None] * len(msgs)
    for i, msg in enumerate(msgs):
        try:
            valid.append(convert.request_from_pb(msg))
        except ValueError as exc:
            errors[i] = RateLimitResponse(error=str(exc))
            continue
        indexes.append(i)
    return valid, indexes, errors


async def answer(
    node: Node, msgs: Sequence[pb.RateLimitReq], *, peer: bool = False
) -> list[pb.RateLimitResp]:
    """Decide every item (client or peer semantics), in request order, as protobuf."""
    start = time.perf_counter()
    valid, indexes, results = decode(msgs)
    metrics = node.metrics
    if len(valid) < len(msgs):
        metrics.check_errors.labels("Invalid algorithm").inc(len(msgs) - len(valid))
    if valid:
        if not peer:
            metrics.in_flight += 1
        try:
            resps = await (node.peer_rate_limits(valid) if peer else node.get_rate_limits(valid))
        finally:
            if not peer:
                metrics.in_flight -= 1
        _place(results, indexes, resps)
    return _encode(node, results, peer, start)


def answer_here(
    node: Node,
    msgs: Sequence[pb.RateLimitReq],
    out: RepeatedCompositeFieldContainer[pb.RateLimitResp],
    *,
    peer: bool = False,
) -> bool:
    """``answer`` without the event loop, made in ``out`` (the response's repeated
    field); False, ``out`` untouched, when an item needs the loop (see
    ``Node.answer_here``). For the threaded servers' gRPC threads."""
    start = time.perf_counter()
    valid, indexes, results = decode(msgs)
    if valid:
        resps = node.answer_here(valid, peer=peer)
        if resps is None:
            return False  # answer() decodes them again, and counts their errors
        _place(results, indexes, resps)
    if len(valid) < len(msgs):
        node.metrics.check_errors.labels("Invalid algorithm").inc(len(msgs) - len(valid))
    for result in results:
        if result is not None:
            convert.add_response(out, result)
    _observe(node, peer, start)
    return True


def forward_now(
    node: Node, request: pb.GetRateLimitsReq, call: Any
) -> Future[pb.GetRateLimitsResp] | None:
    """A client call whose items another node owns, all of them, none GLOBAL, relayed as
    it came from the calling thread (a gRPC thread of the native server, whose ``call``
    it is): the owner's answer finishes ``call`` in the extensions (``PeerClient.relay``).
    The returned future gets an answer only if that call fails; None when the call does
    not qualify or the peer is busy with such calls: the event loop's path then forwards
    it, batched with others.

    The message goes unchanged: GetPeerRateLimitsReq and GetRateLimitsReq, and their
    answers, have the same wire form (one repeated field 1 of the same type), so nothing
    is decoded into smockron's types or re-encoded, and no batching timer or task waits.
    The items count as forwarded once the owner has answered them (``Node.count_relayed``).
    If the call fails, the event loop's path decides them (and counts the failure, routes
    around the peer, answers locally): each item is counted once, by the way it went."""
    msgs = request.requests
    if not msgs or len(msgs) > MAX_BATCH:
        return None
    owner_of, owner, here = node.ring.owner, "", node.address
    for msg in msgs:
        if msg.behavior & _GLOBAL or not msg.name or not msg.unique_key:
            return None
        this = owner_of(f"{msg.name}_{msg.unique_key}")
        if this != owner:
            if owner or this == here:  # two owners, or owned here: stop at once, so a
                return None  # call this node answers pays one lookup here, not one an item
            owner = this
    client = node.clients.get(owner)
    if client is None:
        return None
    future: Future[pb.GetRateLimitsResp] = Future()
    n = len(msgs)

    def done(raw: bytes | None) -> None:  # on the event loop, when the relay failed
        resp = _decoded(raw, n)
        if resp is not None:
            future.set_result(resp)
            return
        task = asyncio.get_running_loop().create_task(answer(node, msgs))
        task.add_done_callback(partial(_settle, future))

    if not client.relay(request.SerializeToString(), n, call, done):
        return None
    return future  # counted as forwarded once answered (Node.count_relayed)


def _decoded(raw: bytes | None, n: int) -> pb.GetRateLimitsResp | None:
    if raw is None:
        return None
    try:
        resp = pb.GetRateLimitsResp.FromString(raw)
    except DecodeError:
        return None
    return resp if len(resp.responses) == n else None


def _settle(
    future: Future[pb.GetRateLimitsResp], task: asyncio.Task[list[pb.RateLimitResp]]
) -> None:
    if task.cancelled():
        future.cancel()
    elif (exc := task.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(pb.GetRateLimitsResp(responses=task.result()))


def _place(
    results: list[RateLimitResponse | None],
    indexes: list[int],
    resps: Sequence[RateLimitResponse],
) -> None:
    """Put the decided items back at their places among the per-item errors."""
    for i, resp in zip(indexes, resps, strict=True):
        results[i] = resp


def _encode(
    node: Node, results: list[RateLimitResponse | None], peer: bool, start: float
) -> list[pb.RateLimitResp]:
    out = [convert.response_to_pb(r) for r in results if r is not None]
    _observe(node, peer, start)
    return out


def _observe(node: Node, peer: bool, start: float) -> None:
    metrics = node.metrics
    (metrics.peer_duration if peer else metrics.client_duration).observe(
        time.perf_counter() - start
    )


def health_pb(node: Node) -> pb.HealthCheckResp:
    status, message, count, advertise = node.health()
    local, region = node.peer_groups()
    return pb.HealthCheckResp(
        status=status,
        message=message,
        peer_count=count,
        advertise_address=advertise,
        local_peers=[_peer_pb(p) for p in local],
        region_peers=[_peer_pb(p) for p in region],
    )


def _peer_pb(peer: PeerInfo) -> pb.PeerHealthResp:
    return pb.PeerHealthResp(grpc_address=peer.grpc_address, data_center=peer.data_center)
