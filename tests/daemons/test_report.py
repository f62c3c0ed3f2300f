"""The peer report datagram: round trips, splitting, dedup, and hostile bytes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smockron.daemons.dthrottle.report import (
    HEADER,
    MAGIC,
    PeerLedger,
    ReportPart,
    check_sizes,
    decode_report,
    encode_report,
    encode_varint,
)
from smockron.errors import ConfigError, ProtocolError


def test_header_is_twenty_bytes_and_layout_is_as_documented() -> None:
    [datagram] = encode_report(0x0102030405060708, 7, {b"C": 10})
    assert HEADER.size == 20
    assert datagram == (
        b"DT\x01\x00" + bytes.fromhex("0102030405060708") + b"\x00\x00\x00\x07"
        b"\x00\x00\x00\x01" + b"\x01C\x0a"
    )


def test_varint_is_leb128() -> None:
    assert encode_varint(0) == b"\x00"
    assert encode_varint(127) == b"\x7f"
    assert encode_varint(128) == b"\x80\x01"
    assert encode_varint(300) == b"\xac\x02"


@given(st.dictionaries(st.binary(max_size=300), st.integers(1, 2**63), max_size=60))
def test_round_trip_through_any_number_of_parts(hits: dict[bytes, int]) -> None:
    datagrams = encode_report(42, 9, hits, max_datagram=400)
    assert all(len(d) <= 400 for d in datagrams)
    merged: dict[bytes, int] = {}
    for i, d in enumerate(datagrams):
        part = decode_report(d, max_tag_length=300)
        assert (part.sender, part.seq, part.part, part.parts) == (42, 9, i, len(datagrams))
        merged.update(part.hits)
    assert merged == hits


def test_large_report_is_split_to_fit_datagrams() -> None:
    hits = {f"192.168.{i // 256}.{i % 256}".encode(): i + 1 for i in range(5000)}
    datagrams = encode_report(1, 1, hits, max_datagram=1400)
    assert len(datagrams) > 50 and all(len(d) <= 1400 for d in datagrams)
    assert sum(len(decode_report(d).hits) for d in datagrams) == 5000


def test_empty_report_sends_nothing() -> None:
    assert encode_report(1, 1, {}) == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "short"),
        (b"DT\x01", "short"),
        (b"XX\x01\x00" + bytes(16) + b"\x01C\x01", "bad_magic"),
        (b"DT\x02\x00" + bytes(12) + b"\x00\x00\x00\x01" + b"\x01C\x01", "bad_version"),
        (b"DT\x01\x00" + bytes(12) + b"\x00\x01\x00\x01" + b"\x01C\x01", "bad_part"),
        (b"DT\x01\x00" + bytes(12) + b"\x00\x00\x00\x00" + b"\x01C\x01", "bad_part"),
        (b"DT\x01\x00" + bytes(12) + b"\x00\x00\x00\x01", "empty"),
        (b"DT\x01\x00" + bytes(12) + b"\x00\x00\x00\x01" + b"\x05C\x01", "truncated"),
        (b"DT\x01\x00" + bytes(12) + b"\x00\x00\x00\x01" + b"\x01C", "truncated"),
        (b"DT\x01\x00" + bytes(12) + b"\x00\x00\x00\x01" + b"\x01C\x80", "truncated"),
        (b"DT\x01\x00" + bytes(12) + b"\x00\x00\x00\x01" + b"\x01C\x00", "bad_count"),
        (b"DT\x01\x00" + bytes(12) + b"\x00\x00\x00\x01" + b"\xff" * 11, "bad_varint"),
        (
            b"DT\x01\x00" + bytes(12) + b"\x00\x00\x00\x01" + b"\x80\x08" + b"x" * 1024 + b"\x01",
            "tag_too_long",
        ),
    ],
)
def test_malformed_datagrams_are_rejected_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_report(data, max_tag_length=256)
    assert info.value.reason == reason


def test_random_garbage_never_raises_anything_but_protocol_error() -> None:
    rng = random.Random(4)
    valid = encode_report(5, 5, {b"tag": 3, b"other": 70000})[0]
    for _ in range(3000):
        n = rng.randrange(0, 80)
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(n))
            data = MAGIC + b"\x01" + data if rng.random() < 0.5 else data
        else:
            mutated = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            data = bytes(mutated[: rng.randrange(len(mutated) + 1)])
        try:
            part = decode_report(data)
        except ProtocolError:
            continue
        assert all(isinstance(k, bytes) and v >= 1 for k, v in part.hits.items())


def test_sizes_that_cannot_carry_a_tag_are_refused() -> None:
    check_sizes(256, 1400)
    with pytest.raises(ConfigError, match="does not fit"):
        check_sizes(1400, 1400)
    with pytest.raises(ConfigError, match="max datagram"):
        check_sizes(1, 70000)


def part(sender: int, seq: int, index: int = 0, parts: int = 1) -> ReportPart:
    return ReportPart(sender, seq, index, parts, {b"x": 1})


def test_ledger_drops_duplicates_and_stale_parts_and_counts_gaps() -> None:
    ledger = PeerLedger()
    assert ledger.accept(part(1, 10, 0, 2))
    assert not ledger.accept(part(1, 10, 0, 2))  # same part again (two transports)
    assert ledger.accept(part(1, 10, 1, 2))
    assert ledger.accept(part(1, 13))  # 11 and 12 never arrived
    assert ledger.missed_reports == 2
    assert not ledger.accept(part(1, 12))  # late: its tokens were already refilled
    assert ledger.accept(part(2, 0))
    assert ledger.peers == 2


def test_ledger_sequence_wraps_around() -> None:
    ledger = PeerLedger()
    assert ledger.accept(part(1, 0xFFFFFFFF))
    assert ledger.accept(part(1, 0))
    assert ledger.missed_reports == 0


def test_ledger_memory_is_bounded_by_forgetting_the_oldest_sender() -> None:
    ledger = PeerLedger(max_senders=3)
    for sender in range(10):
        assert ledger.accept(part(sender, 1))
    assert ledger.peers == 3
    assert ledger.accept(part(0, 1))  # forgotten, so accepted again
