"""The client's side of GetRateLimits and HealthCheck, without I/O: requests built from a
``check``'s arguments, protobuf messages encoded in place and answers decoded, once per
check on the lone path (so written for speed: no keyword arguments, no enum calls that
are not needed), and the durations a user writes limits in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.model import (
    MAX_BATCH,
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.errors import ClientError, ItemError

MILLISECOND = 1
SECOND = 1000 * MILLISECOND
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
"""Durations on the wire are milliseconds; Gubernator's Go client has the same constants."""

MAX_BATCH_SIZE = MAX_BATCH
"""Gubernator rejects a GetRateLimits call with more items than this."""


@dataclass(frozen=True, slots=True)
class HealthCheck:
    status: str
    """``healthy`` or ``unhealthy``."""
    message: str
    peer_count: int
    advertise_address: str
    local_peers: tuple[PeerInfo, ...] = ()
    """The nodes of the answering node's data center, itself included."""
    region_peers: tuple[PeerInfo, ...] = ()
    """The nodes of other data centers."""

    @property
    def healthy(self) -> bool:
        return self.status == "healthy"


def health_of(msg: pb.HealthCheckResp) -> HealthCheck:
    return HealthCheck(
        msg.status,
        msg.message,
        msg.peer_count,
        msg.advertise_address,
        tuple(PeerInfo(p.grpc_address, data_center=p.data_center) for p in msg.local_peers),
        tuple(PeerInfo(p.grpc_address, data_center=p.data_center) for p in msg.region_peers),
    )


def _ms(duration: int | timedelta) -> int:
    if isinstance(duration, timedelta):
        return int(duration.total_seconds() * 1000)
    return int(duration)


def make_request(
    name: str,
    key: str,
    hits: int,
    limit: int,
    duration: int | timedelta,
    algorithm: Algorithm,
    behavior: Behavior,
    burst: int,
    metadata: Mapping[str, str] | None,
) -> RateLimitRequest:
    # conversions only when needed: this runs once per check, and the enum calls alone
    # cost twice the rest
    return RateLimitRequest(
        name,
        key,
        hits,
        limit,
        duration if type(duration) is int else _ms(duration),
        algorithm if type(algorithm) is Algorithm else Algorithm(algorithm),
        behavior if type(behavior) is Behavior else Behavior(behavior),
        burst,
        dict(metadata) if metadata else {},
    )


def checked(resp: RateLimitResponse, name: str, key: str) -> RateLimitResponse:
    """``resp``, unless the server answered the item with an error (ItemError)."""
    if resp.error:
        raise ItemError(f"rate limit {name}/{key}: {resp.error}", resp)
    return resp


def encode_batches(requests: Sequence[RateLimitRequest]) -> list[pb.GetRateLimitsReq]:
    """The same message convert.request_to_pb gives, built in place: an empty item per
    request, its fields set one by one and zero fields left unset, at under half the
    CPU of keyword arguments (paid per check, by a lone one and in a coalesced call)."""
    out = []
    for i in range(0, len(requests), MAX_BATCH_SIZE):
        msg = pb.GetRateLimitsReq()
        add = msg.requests.add
        for r in requests[i : i + MAX_BATCH_SIZE]:
            item = add()
            item.name = r.name
            item.unique_key = r.unique_key
            item.hits = r.hits
            item.limit = r.limit
            item.duration = r.duration
            if r.algorithm:
                item.algorithm = r.algorithm  # type: ignore[assignment]
            if r.behavior:
                item.behavior = r.behavior  # type: ignore[assignment]
            if r.burst:
                item.burst = r.burst
            if r.metadata:
                item.metadata.update(r.metadata)
            if r.created_at is not None:
                item.created_at = r.created_at
        out.append(msg)
    return out


def responses_of(
    sent: pb.GetRateLimitsReq, got: pb.GetRateLimitsResp, address: str
) -> list[RateLimitResponse]:
    """As convert.response_from_pb for each, inlined: this runs once per check."""
    if len(got.responses) != len(sent.requests):
        raise ClientError(
            f"GetRateLimits on {address}: {len(got.responses)} responses "
            f"for {len(sent.requests)} requests"
        )
    return [response_of(m) for m in got.responses]


def single_of(
    sent: pb.GetRateLimitsReq, got: pb.GetRateLimitsResp, address: str
) -> RateLimitResponse:
    """The answer to a one-request call: ``responses_of`` without the list machinery (a
    lone check's path, where every microsecond is paid per check)."""
    if len(got.responses) != 1:
        responses_of(sent, got, address)  # raises the count error
    return response_of(got.responses[0])


def response_of(m: pb.RateLimitResp) -> RateLimitResponse:
    status = Status.OVER_LIMIT if m.status == pb.OVER_LIMIT else Status.UNDER_LIMIT
    md = m.metadata
    # a comprehension reads the protobuf map at a third of dict()'s cost
    metadata = {key: md[key] for key in md} if md else {}
    return RateLimitResponse(status, m.limit, m.remaining, m.reset_time, m.error, metadata)


def native_response(
    fields: tuple[int, int, int, int, str, dict[str, str]],
) -> RateLimitResponse:
    """A response from the native channel's decoded fields (status as on the wire)."""
    status, limit, remaining, reset_time, error, metadata = fields
    state = Status.OVER_LIMIT if status == pb.OVER_LIMIT else Status.UNDER_LIMIT
    return RateLimitResponse(state, limit, remaining, reset_time, error, metadata)


def as_field1(item: bytes) -> bytes:
    """A message holding ``item`` as its one field 1 (GetRateLimitsReq's ``requests``)."""
    n, size = len(item), bytearray()
    while n > 0x7F:
        size.append(n & 0x7F | 0x80)
        n >>= 7
    size.append(n)
    return b"\x0a" + bytes(size) + item


def only_field1(raw: bytes) -> bytes | None:
    """The one field 1 of ``raw`` (GetRateLimitsResp's one response), or None when
    ``raw`` is anything else (several, none, other fields)."""
    if not raw or raw[0] != 0x0A:
        return None
    n = shift = 0
    i = 1
    while i < len(raw) and i < 6:
        byte = raw[i]
        n |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return raw[i:] if len(raw) - i == n else None
        shift += 7
    return None
