"""The Smockron codec: byte-exact frames, round trips, and every malformed case."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smockron.errors import ProtocolError
from smockron.wire.codec import (
    ACCEPTED,
    DELAYED,
    REJECTED,
    Accounting,
    Control,
    Limits,
    decode_accounting,
    decode_control,
    encode_accounting,
    encode_control,
)


def test_frames_byte_for_byte() -> None:
    assert encode_accounting("api", ACCEPTED, b"10.0.0.1", 1391300000123) == [
        b"api\0",
        b"ACCEPTED",
        b"10.0.0.1",
        b"1391300000123",
        b"",
    ]
    assert encode_accounting(b"api", DELAYED, b"k", 5, 7, b"UA: curl") == [
        b"api\0",
        b"DELAYED",
        b"k",
        b"5",
        b"7",
        b"UA: curl",
    ]
    assert encode_control("api", b"10.0.0.1", 1391300001000) == [
        b"api\0",
        b"DELAY_UNTIL",
        b"10.0.0.1",
        b"1391300001000",
    ]


def test_effective_timestamp() -> None:
    assert decode_accounting([b"d\0", DELAYED, b"i", b"1", b"9"]).effective_ms == 9
    assert decode_accounting([b"d\0", ACCEPTED, b"i", b"1", b""]).effective_ms == 1


domains = st.binary(min_size=1, max_size=64).filter(lambda b: b"\0" not in b)
stamps = st.integers(0, 253_402_300_799_999)


@given(
    domains,
    st.sampled_from([ACCEPTED, REJECTED]),
    st.binary(max_size=200),
    stamps,
    st.none() | st.binary(max_size=300),
)
def test_accounting_round_trip(
    domain: bytes, status: bytes, ident: bytes, ts: int, loginfo: bytes | None
) -> None:
    msg = decode_accounting(encode_accounting(domain, status, ident, ts, None, loginfo))
    assert msg == Accounting(domain, status, ident, ts, None, loginfo)


@given(domains, st.binary(max_size=200), stamps, stamps)
def test_delayed_round_trip(domain: bytes, ident: bytes, ts: int, delayed: int) -> None:
    msg = decode_accounting(encode_accounting(domain, DELAYED, ident, ts, delayed))
    assert msg == Accounting(domain, DELAYED, ident, ts, delayed, None)


@given(domains, st.binary(max_size=200), stamps)
def test_control_round_trip(domain: bytes, ident: bytes, ts: int) -> None:
    assert decode_control(encode_control(domain, ident, ts)) == Control(domain, ident, ts)


GOOD = [b"api\0", ACCEPTED, b"id", b"1000", b""]


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "frame_count"),
        (GOOD[:4], "frame_count"),
        ([*GOOD, b"log", b"extra"], "frame_count"),
        ([b"api", *GOOD[1:]], "domain_nul"),
        ([b"a\0pi\0", *GOOD[1:]], "domain_nul"),
        ([b"\0", *GOOD[1:]], "domain_empty"),
        ([b"x" * 300 + b"\0", *GOOD[1:]], "oversized"),
        ([GOOD[0], b"accepted", *GOOD[2:]], "bad_status"),
        ([GOOD[0], b"", *GOOD[2:]], "bad_status"),
        ([*GOOD[:2], b"i" * 2000, *GOOD[3:]], "oversized"),
        ([*GOOD[:3], b"", b""], "bad_timestamp"),
        ([*GOOD[:3], b"-5", b""], "bad_timestamp"),
        ([*GOOD[:3], b"+5", b""], "bad_timestamp"),
        ([*GOOD[:3], b"1e3", b""], "bad_timestamp"),
        ([*GOOD[:3], b" 12", b""], "bad_timestamp"),
        ([*GOOD[:3], "١٢".encode(), b""], "bad_timestamp"),
        ([*GOOD[:3], b"99999999999999999", b""], "bad_timestamp"),
        ([*GOOD[:3], b"999999999999999", b""], "bad_timestamp"),
        ([GOOD[0], DELAYED, b"id", b"1000", b""], "delayed_ts"),
        ([GOOD[0], DELAYED, b"id", b"1000", b"x"], "bad_timestamp"),
        ([*GOOD[:4], b"1200"], "delayed_ts"),
        ([*GOOD, b"L" * 9000], "oversized"),
    ],
)
def test_decode_accounting_rejects(frames: list[bytes], reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_accounting(frames)
    assert info.value.reason == reason
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"api\0", b"DELAY_UNTIL"], "frame_count"),
        ([b"api\0", b"DELAY_UNTIL", b"id"], "frame_count"),
        ([b"api\0", b"DELAY_UNTIL", b"id", b"1", b"2"], "frame_count"),
        ([b"api\0", b"SPEED_UP", b"id", b"1"], "bad_command"),
        ([b"api", b"DELAY_UNTIL", b"id", b"1"], "domain_nul"),
        ([b"api\0", b"DELAY_UNTIL", b"id", b"soon"], "bad_timestamp"),
        ([b"api\0", b"DELAY_UNTIL", b"id", b"-1"], "bad_timestamp"),
        ([b"api\0", b"DELAY_UNTIL", b"id", b"99999999999999999"], "bad_timestamp"),
        ([b"api\0", b"DELAY_UNTIL", b"id", b""], "bad_timestamp"),
        ([b"api\0", b"DELAY_UNTIL", b"i" * 2000, b"1"], "oversized"),
        ([b"x" * 300 + b"\0", b"DELAY_UNTIL", b"id", b"1"], "oversized"),
        ([b"\0", b"DELAY_UNTIL", b"id", b"1"], "domain_empty"),
        ([b"api\0", b"", b"id", b"1"], "bad_command"),
    ],
)
def test_decode_control_rejects(frames: list[bytes], reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_control(frames)
    assert info.value.reason == reason


def test_limits_are_configurable() -> None:
    tight = Limits(max_identifier=4)
    with pytest.raises(ProtocolError):
        decode_accounting([b"d\0", ACCEPTED, b"12345", b"1", b""], tight)
    assert decode_accounting([b"d\0", ACCEPTED, b"1234", b"1", b""], tight).identifier == b"1234"


@given(st.lists(st.binary(max_size=40), max_size=8))
def test_garbage_never_raises_anything_but_protocol_error(frames: list[bytes]) -> None:
    for decode in (decode_accounting, decode_control):
        with contextlib.suppress(ProtocolError):
            decode(frames)


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        (b"10.0", "bad_rule"),
        (b"inf 20", "bad_rule"),
        (b"nan 20", "bad_rule"),
        (b"1e-300 20", "bad_rule"),
        (b"10.0 -1", "bad_rule"),
        (b"10.0 0", "bad_rule"),
        (b"10.0 9999999999", "bad_rule"),
        (b"10.0  20", "bad_rule"),
        (b"\xff 20", "bad_rule"),
    ],
)
def test_decode_rules_refuses_bad_rules(rule: bytes, reason: str) -> None:
    from smockron.wire.codec import RULES, RULES_TOPIC, decode_rules

    with pytest.raises(ProtocolError) as err:
        decode_rules([RULES_TOPIC, RULES, b"api", b"history", rule])
    assert err.value.reason == reason


def test_rules_offer_round_trip_and_shape() -> None:
    from smockron.core.rules import Rule
    from smockron.wire.codec import RULES_TOPIC, decode_rules, encode_rules

    rules = (Rule(10.0, 20), Rule(1000 / 3600, 1000))
    frames = encode_rules("api", "gcra", rules)
    assert frames[0] == RULES_TOPIC and frames[2] == b"api"
    offer = decode_rules(frames)
    assert (offer.domain, offer.algorithm, offer.rules) == (b"api", "gcra", rules)
    for bad in (
        [RULES_TOPIC, b"RULES", b"api", b"history"],  # no rule
        [RULES_TOPIC, b"RULES", b"a\0b", b"history", b"1.0 1"],  # NUL in the domain
        [RULES_TOPIC, b"RULES", b"api", b"history", *[b"1.0 1"] * 65],
    ):
        with pytest.raises(ProtocolError):
            decode_rules(bad)
