"""Accounting messages decoded while they are received: one contract, two twins.

A receive loop hands the master two lists per batch: *records*, the messages that are
plainly valid for a configured domain, already decoded; and *raw* messages, everything
else, for the codec (:func:`smockron.wire.codec.decode_accounting`) to name the problem
or to find them valid after all. Both twins below keep that contract exactly:

- :func:`split_accounting`: pure Python, frames in, no I/O (also what
  :func:`drain_accounting_python` runs on what it drained);
- the compiled ``drain_accounting`` of ``_zmqfast.c``, which decodes while it receives.

:func:`drain_accounting` is the compiled one when it loaded, else the Python one.
A record is ``(domain, status, identifier, received ms, delayed ms or None)`` where
``domain`` is whatever the caller's ``topics`` map a topic frame to. Timestamps are
floats (integral, below 2**53): the engine compares them with floats, and CPython
compares an int with a float far more slowly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeAlias, TypeVar, cast

import zmq

from smockron.wire.batchio import drain_accounting_c, drain_python
from smockron.wire.codec import ACCEPTED, DELAYED, REJECTED, Limits

D = TypeVar("D")
Record: TypeAlias = tuple[D, bytes, bytes, float, float | None]
Raw: TypeAlias = Sequence[bytes]
Split: TypeAlias = tuple[list[Record[D]], list[Raw]]
DrainAccounting: TypeAlias = Callable[[zmq.Socket[bytes], int, dict[bytes, D], Limits], Split[D]]
_STATUSES = (ACCEPTED, DELAYED, REJECTED)


def split_accounting(batch: Iterable[Raw], topics: dict[bytes, D], limits: Limits) -> Split[D]:
    """Records for the messages plainly valid for a known topic; the rest raw, in order."""
    max_id = limits.max_identifier
    max_log = limits.max_loginfo
    max_digits = limits.max_timestamp_digits
    max_ts = limits.max_timestamp_ms
    records: list[Record[D]] = []
    raw: list[Raw] = []
    keep, spill = records.append, raw.append
    get = topics.get
    accepted, delayed, rejected = ACCEPTED, DELAYED, REJECTED
    for frames in batch:
        n = len(frames)
        if n == 5 or n == 6:
            dom = get(frames[0])
            received_f = frames[3]
            if (
                dom is not None
                and received_f.isdigit()
                and len(received_f) <= max_digits
                and len(frames[2]) <= max_id
                and (n == 5 or len(frames[5]) <= max_log)
            ):
                received = int(received_f)
                status = frames[1]
                delayed_f = frames[4]
                if received <= max_ts:
                    # two comparisons: cheaper than a tuple built per message
                    if (status == accepted or status == rejected) and not delayed_f:  # noqa: SIM109
                        keep((dom, status, frames[2], float(received), None))
                        continue
                    if (
                        status == delayed
                        and delayed_f.isdigit()
                        and len(delayed_f) <= max_digits
                        and int(delayed_f) <= max_ts
                    ):
                        keep((dom, status, frames[2], float(received), float(delayed_f)))
                        continue
        spill(frames)
    return records, raw


def drain_accounting_python(
    sock: zmq.Socket[bytes], limit: int, topics: dict[bytes, D], limits: Limits
) -> Split[D]:
    """Up to ``limit`` queued messages, split as :func:`split_accounting` does."""
    return split_accounting(drain_python(sock, limit), topics, limits)


COMPILED = drain_accounting_c is not None
"""Whether the compiled twin loaded (``SMOCKRON_PURE_PYTHON=1`` keeps it unloaded)."""


def drain_accounting_compiled(
    sock: zmq.Socket[bytes], limit: int, topics: dict[bytes, D], limits: Limits
) -> Split[D]:
    """The compiled twin of :func:`drain_accounting_python`; only when ``COMPILED``."""
    if drain_accounting_c is None:
        raise RuntimeError("smockron.wire._zmqfast is not loaded")
    bounds = (
        limits.max_identifier,
        limits.max_loginfo,
        limits.max_timestamp_digits,
        limits.max_timestamp_ms,
    )
    records, raw = drain_accounting_c(sock, limit, topics, _STATUSES, bounds)
    return records, cast(list[Raw], raw)


def drain_accounting(
    sock: zmq.Socket[bytes], limit: int, topics: dict[bytes, D], limits: Limits
) -> Split[D]:
    """Up to ``limit`` queued messages, decoded while received; never blocks."""
    if COMPILED:
        return drain_accounting_compiled(sock, limit, topics, limits)
    return drain_accounting_python(sock, limit, topics, limits)
