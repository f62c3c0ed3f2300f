"""The compiled accounting decoder (``_zmqfast.drain_accounting``) against its Python twin
(:func:`smockron.wire.accounting.drain_accounting_python`), over a real ZeroMQ PUSH/PULL
pair on 127.0.0.1, on messages hypothesis makes: valid ones, and hostile ones near every
bound the contract checks (frame counts, unknown topics, statuses, digits, lengths).

Both must return the same records (same values and types: timestamps are floats) and
the same raw messages in the same order, and agree with :func:`split_accounting`, the
pure contract.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smockron.wire.accounting import (
    COMPILED,
    DrainAccounting,
    drain_accounting_compiled,
    drain_accounting_python,
    split_accounting,
)
from smockron.wire.codec import ACCEPTED, DELAYED, MAX_FRAMES, REJECTED, Limits, frame_count
from tests.wire.conftest import push_pull

pytestmark = pytest.mark.skipif(not COMPILED, reason="smockron.wire._zmqfast is not built")

TOPICS = {b"api\0": "api", b"web\0": "web"}

limits = st.one_of(
    st.just(Limits()),
    st.builds(
        Limits,
        max_identifier=st.integers(0, 30),
        max_loginfo=st.integers(0, 30),
        max_timestamp_ms=st.integers(0, 10**15),
        max_timestamp_digits=st.integers(1, 17),
    ),
)


def _near(bound: int) -> st.SearchStrategy[int]:
    """Values at, just under and just over ``bound``, or anywhere below it."""
    return st.integers(max(0, bound - 2), bound + 2) | st.integers(0, max(0, bound))


@st.composite
def batches(draw: st.DrawFn) -> tuple[Limits, list[list[bytes]]]:
    """Limits, and messages against them: plainly valid ones, ones a byte or a digit past
    a bound, and hostile ones (wrong topics, statuses, frame counts, not-quite digits)."""
    bounds = draw(limits)
    stamp = _near(bounds.max_timestamp_ms).map(lambda n: b"%d" % n)
    digits = st.one_of(
        stamp,
        st.integers(0, 10**17).map(lambda n: b"%d" % n),
        _near(bounds.max_timestamp_digits).map(lambda n: b"0" * n),  # leading zeros
        st.sampled_from([b"", b"+1", b"-1", b" 1", b"1 ", b"1.0", b"0x1", b"\xd9\xa1", b"\0"]),
    )
    ident = _near(bounds.max_identifier).map(lambda n: b"i" * n) | st.binary(max_size=12)
    loginfo = _near(bounds.max_loginfo).map(lambda n: b"l" * n) | st.binary(max_size=12)
    topic = st.sampled_from([b"api\0", b"web\0"])
    status = st.sampled_from([ACCEPTED, DELAYED, REJECTED])
    wrong_topic = st.sampled_from([b"api", b"other\0", b"", b"api\0\0", b"\0"])
    wrong_status = st.sampled_from([b"accepted", b"ACCEPTEDX", b"DELAY_UNTIL", b""])
    valid = st.tuples(topic, status, ident, stamp, stamp, st.none() | loginfo).map(
        lambda m: [*m[:4], m[4] if m[1] == DELAYED else b"", *([m[5]] if m[5] is not None else [])]
    )
    hostile = st.one_of(
        st.tuples(topic | wrong_topic, status | wrong_status, ident, digits, digits).map(list),
        st.tuples(topic, status, ident, digits, digits, loginfo, loginfo).map(list),
        st.lists(st.one_of(topic, status, digits, ident), min_size=1, max_size=9),
        st.integers(MAX_FRAMES - 1, MAX_FRAMES + 3).map(lambda n: [b"api\0"] * n),
    )
    return bounds, draw(st.lists(st.one_of(valid, valid, hostile), min_size=8, max_size=40))


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """One PUSH/PULL pair for every example (a new one each would dominate the run)."""
    with push_pull() as p:
        yield p


def _received(
    drain: DrainAccounting[Any],
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    batch: list[list[bytes]],
    limits: Limits,
) -> tuple[list[Any], list[tuple[list[bytes], int]]]:
    """``batch`` sent over the pair and drained by ``drain``, a few messages at a time."""
    push, pull = pair
    for frames in batch:
        push.send_multipart(frames)
    records: list[Any] = []
    raw: list[tuple[list[bytes], int]] = []
    while len(records) + len(raw) < len(batch):
        assert pull.poll(10_000), "a message sent on 127.0.0.1 never arrived"
        got, spilled = drain(pull, 4, TOPICS, limits)
        assert len(got) + len(spilled) <= 4
        records.extend(got)
        raw.extend((list(m), frame_count(m)) for m in spilled)
    assert len(records) + len(raw) == len(batch)
    return records, raw


def _typed(records: list[Any]) -> list[tuple[Any, ...]]:
    """Records with each value's type: a float must not come back as an int."""
    return [tuple((type(v).__name__, v) for v in record) for record in records]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches())
def test_compiled_and_python_decoders_agree(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], case: tuple[Limits, list[list[bytes]]]
) -> None:
    bounds, batch = case
    python = _received(drain_accounting_python, pair, batch, bounds)
    compiled = _received(drain_accounting_compiled, pair, batch, bounds)
    assert _typed(compiled[0]) == _typed(python[0])
    assert compiled[1] == python[1]
    pure_records, pure_raw = split_accounting(batch, TOPICS, bounds)
    assert _typed(python[0]) == _typed(pure_records)
    assert python[1] == [(m[:MAX_FRAMES], len(m)) for m in pure_raw]
