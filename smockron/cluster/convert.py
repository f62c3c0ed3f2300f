"""Conversion between the generated protobuf messages and smockron.cluster.model types.

The one place that knows both shapes, so the gRPC servicers, the HTTP gateway, the peer
client and the Python client library never hand-copy fields. Unknown algorithm values
raise ValueError (the caller turns it into that item's ``error``); behavior is a set of
flags, so unknown bits are kept.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.core.vocabulary import BY_NUMBER

_ALGORITHMS = BY_NUMBER


def algorithm_from_int(value: int) -> Algorithm:
    try:
        return _ALGORITHMS[value]
    except KeyError:
        raise ValueError(
            f"invalid rate limit algorithm '{value}'; known: "
            + ", ".join(f"{a.name}={a.value}" for a in Algorithm)
        ) from None


def behavior_from_int(value: int) -> Behavior:
    """IntFlag construction is slow; the few combinations in use are memoised."""
    flags = _BEHAVIORS.get(value)
    if flags is None:
        flags = Behavior(value)
        if len(_BEHAVIORS) < 4096:
            _BEHAVIORS[value] = flags
    return flags


_BEHAVIORS: dict[int, Behavior] = {}


def request_from_pb(msg: pb.RateLimitReq) -> RateLimitRequest:
    """A model request; ValueError for an algorithm this node does not implement."""
    algorithm = _ALGORITHMS.get(msg.algorithm)
    return RateLimitRequest(
        name=msg.name,
        unique_key=msg.unique_key,
        hits=msg.hits,
        limit=msg.limit,
        duration=msg.duration,
        algorithm=algorithm if algorithm is not None else algorithm_from_int(msg.algorithm),
        behavior=behavior_from_int(msg.behavior),
        burst=msg.burst,
        metadata=dict(msg.metadata) if msg.metadata else {},
        created_at=msg.created_at if msg.HasField("created_at") else None,
    )


def request_to_pb(req: RateLimitRequest) -> pb.RateLimitReq:
    msg = pb.RateLimitReq(
        name=req.name,
        unique_key=req.unique_key,
        hits=req.hits,
        limit=req.limit,
        duration=req.duration,
        algorithm=req.algorithm.value,  # type: ignore[arg-type]
        behavior=req.behavior.value,  # type: ignore[arg-type]
        burst=req.burst,
    )
    if req.metadata:
        md = msg.metadata
        for key, value in req.metadata.items():
            md[key] = value
    if req.created_at is not None:
        msg.created_at = req.created_at
    return msg


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int64(value: int) -> int:
    return min(max(value, INT64_MIN), INT64_MAX)


def response_to_pb(resp: RateLimitResponse) -> pb.RateLimitResp:
    return _built(pb.RateLimitResp, resp)


def add_response(
    out: RepeatedCompositeFieldContainer[pb.RateLimitResp], resp: RateLimitResponse
) -> None:
    """``response_to_pb`` made in place in ``out`` (a response's repeated field): a
    message made apart and put in the field would be copied there."""
    _built(out.add, resp)


def _built(make: Callable[..., pb.RateLimitResp], resp: RateLimitResponse) -> pb.RateLimitResp:
    # Map and string fields are set after construction: passing ``metadata=`` to the
    # constructor costs more than the rest of the conversion together.
    try:
        msg = make(
            status=resp.status.value,
            limit=resp.limit,
            remaining=resp.remaining,
            reset_time=resp.reset_time,
        )
    except ValueError:
        # Extreme but valid int64 inputs (duration or created_at near the int64 bounds,
        # hits of -2**63 given back) can leave int64 in Python's arithmetic: saturate, so
        # the item is answered and the rest of the call is not lost to one item.
        msg = make(
            status=resp.status.value,
            limit=_int64(resp.limit),
            remaining=_int64(resp.remaining),
            reset_time=_int64(resp.reset_time),
        )
    if resp.error:
        msg.error = resp.error
    if resp.metadata:
        md = msg.metadata
        for key, value in resp.metadata.items():
            md[key] = value
    return msg


def response_from_pb(msg: pb.RateLimitResp) -> RateLimitResponse:
    return RateLimitResponse(
        status=Status.OVER_LIMIT if msg.status == pb.OVER_LIMIT else Status.UNDER_LIMIT,
        limit=msg.limit,
        remaining=msg.remaining,
        reset_time=msg.reset_time,
        error=msg.error,
        metadata=dict(msg.metadata) if msg.metadata else {},
    )
