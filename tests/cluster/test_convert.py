"""pb <-> model conversion keeps every field, and Gubernator's wire numbers hold."""

from __future__ import annotations

import pytest

from smockron.cluster import convert
from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import peers_pb2


def test_wire_numbers_match_gubernator() -> None:
    fields = {f.name: f.number for f in pb.RateLimitReq.DESCRIPTOR.fields}
    assert fields == {
        "name": 1,
        "unique_key": 2,
        "hits": 3,
        "limit": 4,
        "duration": 5,
        "algorithm": 6,
        "behavior": 7,
        "burst": 8,
        "metadata": 9,
        "created_at": 10,
    }
    resp = {f.name: f.number for f in pb.RateLimitResp.DESCRIPTOR.fields}
    assert resp == {
        "status": 1,
        "limit": 2,
        "remaining": 3,
        "reset_time": 4,
        "error": 5,
        "metadata": 6,
    }
    assert {v.name: v.number for v in pb.Behavior.DESCRIPTOR.values} == {
        name: b.value for name, b in Behavior.__members__.items()
    }
    assert {v.name: v.number for v in pb.Algorithm.DESCRIPTOR.values} == {
        a.name: a.value for a in Algorithm
    }
    health = {f.name: f.number for f in pb.HealthCheckResp.DESCRIPTOR.fields}
    assert health == {
        "status": 1,
        "message": 2,
        "peer_count": 3,
        "advertise_address": 4,
        "local_peers": 5,
        "region_peers": 6,
    }
    peer = {f.name: f.number for f in pb.PeerHealthResp.DESCRIPTOR.fields}
    assert peer == {"grpc_address": 1, "data_center": 2}
    glob = {f.name: f.number for f in peers_pb2.UpdatePeerGlobal.DESCRIPTOR.fields}
    assert glob == {"key": 1, "status": 2, "algorithm": 3, "duration": 4, "created_at": 5}
    assert pb.DESCRIPTOR.package == "pb.gubernator"
    assert set(pb.DESCRIPTOR.services_by_name["V1"].methods_by_name) == {
        "GetRateLimits",
        "HealthCheck",
        "LiveCheck",
    }


def test_request_round_trip() -> None:
    req = RateLimitRequest(
        name="n",
        unique_key="k",
        hits=-3,
        limit=10,
        duration=1000,
        algorithm=Algorithm.SLIDING_WINDOW,
        behavior=Behavior.GLOBAL | Behavior.DRAIN_OVER_LIMIT,
        burst=20,
        metadata={"a": "b"},
        created_at=1_700_000_000_000,
    )
    wire = convert.request_to_pb(req).SerializeToString()
    back = convert.request_from_pb(pb.RateLimitReq.FromString(wire))
    assert back == req
    unset = convert.request_from_pb(pb.RateLimitReq(name="n", unique_key="k"))
    assert unset.created_at is None
    assert unset.behavior == Behavior.BATCHING


def test_unknown_algorithm_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="invalid rate limit algorithm '9'"):
        convert.request_from_pb(pb.RateLimitReq(name="n", unique_key="k", algorithm=9))  # type: ignore[arg-type]


def test_response_round_trip() -> None:
    resp = RateLimitResponse(
        status=Status.OVER_LIMIT,
        limit=5,
        remaining=0,
        reset_time=123,
        error="",
        metadata={"owner": "127.0.0.1:1051"},
    )
    wire = convert.response_to_pb(resp).SerializeToString()
    assert convert.response_from_pb(pb.RateLimitResp.FromString(wire)) == resp


def test_response_beyond_int64_saturates() -> None:
    resp = RateLimitResponse(
        status=Status.UNDER_LIMIT,
        limit=2**63 - 1,
        remaining=5 + 2**63,
        reset_time=-(2**63) - 1000,
        error="",
        metadata={"owner": "n1"},
    )
    msg = convert.response_to_pb(resp)
    assert (msg.limit, msg.remaining, msg.reset_time) == (2**63 - 1, 2**63 - 1, -(2**63))
    assert msg.metadata["owner"] == "n1"
