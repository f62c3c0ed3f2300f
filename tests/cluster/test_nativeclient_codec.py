"""The native channel's codec of one check (``encode_request``, ``decode_response``, what
``Channel.check`` sends and reads) against the generated protobuf classes, for any
values: the request parses back to the message the client's own encoder builds, and
any response the classes serialize decodes to the same values."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smockron.cluster.client import NATIVE_AVAILABLE
from smockron.cluster.convert import request_to_pb
from smockron.cluster.model import Algorithm, Behavior, RateLimitRequest
from smockron.cluster.pb import gubernator_pb2 as pb

try:
    from smockron.cluster import _nativeclient  # type: ignore[attr-defined]
except ImportError:
    _nativeclient = None

pytestmark = pytest.mark.skipif(not NATIVE_AVAILABLE, reason="_nativeclient not built")

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
int64 = st.integers(-(2**63), 2**63 - 1)


@given(
    st.tuples(
        text,
        text,
        int64,
        int64,
        int64,
        st.sampled_from(list(Algorithm)),
        st.builds(Behavior, st.integers(0, 2**31 - 1)),
        int64,
        st.dictionaries(text, text, max_size=4),
        st.none() | int64,
    )
)
def test_request_parses_back_to_the_message_convert_gives(fields: tuple[Any, ...]) -> None:
    wire = _nativeclient.encode_request(*fields[:8], fields[8] or None, fields[9])
    expected = request_to_pb(RateLimitRequest(*fields))
    assert pb.RateLimitReq.FromString(wire) == expected
    if not fields[8]:  # one order of fields: the same bytes too
        assert wire == expected.SerializeToString()


@given(
    st.sampled_from([pb.UNDER_LIMIT, pb.OVER_LIMIT]),
    int64,
    int64,
    int64,
    text,
    st.dictionaries(text, text, max_size=4),
)
def test_response_decodes_to_its_values(
    status: int, limit: int, remaining: int, reset: int, error: str, metadata: dict[str, str]
) -> None:
    msg = pb.RateLimitResp(
        status=status,  # type: ignore[arg-type]
        limit=limit,
        remaining=remaining,
        reset_time=reset,
        error=error,
        metadata=metadata,
    )
    wire = msg.SerializeToString()
    assert _nativeclient.decode_response(wire) == (status, limit, remaining, reset, error, metadata)
    # fields it does not know (a newer server's) are skipped
    unknown = b"\x78\x05" + b"\x82\x01\x03abc" + b"\x8d\x01\x00\x00\x00\x00"
    assert _nativeclient.decode_response(unknown + wire + unknown)[:5] == (
        status,
        limit,
        remaining,
        reset,
        error,
    )


@pytest.mark.parametrize("wire", [b"\x08", b"\x2a\x05ab", b"\x32\x02\x0a\x05", b"\x0f"])
def test_malformed_response_is_an_internal_error(wire: bytes) -> None:
    with pytest.raises(_nativeclient.CallError) as info:
        _nativeclient.decode_response(wire)
    assert info.value.args[0] == 13  # INTERNAL


def test_request_values_of_the_wrong_type_are_refused() -> None:
    with pytest.raises(TypeError):
        _nativeclient.encode_request(b"name", "k", 1, 2, 3, 0, 0, 0, None, None)
    with pytest.raises(TypeError):
        _nativeclient.encode_request("n", "k", 1, 2, 3, 0, 0, 0, {"a": 1}, None)
    with pytest.raises(OverflowError):
        _nativeclient.encode_request("n", "k", 2**64, 2, 3, 0, 0, 0, None, None)
