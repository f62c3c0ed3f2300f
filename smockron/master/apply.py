"""One accounting message applied to its domain's rules: the history rule (with debt) and
GCRA, inlined for the master's hot path (each the named twin of its ``smockron.core``
function, compared in tests). Each returns the DELAY_UNTIL to publish, or None.

Tables of the memory store (``Domain.packed``, ``Domain.scalar``) are read and written
here without a method call: a state is looked up in the table's ``current`` generation
first (every memory table's ``get`` starts there), and written there and, if the table
holds one for the identifier, over its lasting state, as ``put`` does. Twin of
``MemoryTable.get`` and ``MemoryTable.put`` (two Python calls fewer per rule and
message). The memory store's history tables hold their states packed (one ``bytes``
of float64s, see smockron.master.stores.memory): single timestamps are read where
needed (``AT``), a state is unpacked only to find the oldest of a history that may be
full, and written as the kept bytes plus the new timestamp's; its GCRA tables
(``scalar``) hold each state as its one float. Other tables (Redis, the original
layout) hold tuples, are read from ``current`` first too, and are written with
``put``, which notes each write."""

from __future__ import annotations

from smockron.master.domains import Domain, Hot
from smockron.master.stores.base import State, Stored
from smockron.master.stores.memory import PACK_ONE, UNPACK, UNPACK_FROM

AT = UNPACK_FROM[1]
"""``AT(raw, i << 3)[0]``: the ``i``-th timestamp of a packed state, nothing else unpacked."""

ON_TIME_MS = 500.0
"""GCRA applies a message at the master's ``now`` when it is at most this old (the
original master's formula), at its own time when older."""


def apply_history(
    dom: Domain, ident: bytes, ts: float, now_ms: float, ahead: float
) -> float | None:
    """The history rule for one message; for a one-rule domain, inlined here.

    Twin of smockron.core.history.served_at, recorded and next_allowed (compared in
    tests/core/test_twins.py)."""
    one = dom.one
    if one is None or not dom.packed:  # several rules, or tuples (Redis, original)
        return _apply_histories(dom, ident, ts, now_ms, ahead)
    # One rule of the memory store (most domains): _apply_histories inlined, with
    # ``recorded`` and ``next_allowed`` too, on a packed state (a plain table). A stored
    # history holds at most ``burst`` timestamps, so it is full (``burst`` of them within
    # a window of a time) exactly when its oldest one is within that window: ``min`` in
    # C instead of a count in Python.
    table, window, interval, burst = one
    raw = table.current.get(ident) or table.recall(ident) or b""
    # The timestamps are read where needed (``AT``), and unpacked together only to
    # find the oldest of a history that may be full: a client under its rule costs the
    # same at any burst, not an unpacking of ``burst`` timestamps a message.
    n = len(raw) >> 3
    if dom.debt and n >= burst:
        last = AT(raw, (n - 1) << 3)[0]
        nxt = last + interval
        horizon = last - window  # full: every entry after it (the oldest first: cheap)
        if nxt > ts and AT(raw, 0)[0] > horizon and min(UNPACK[len(raw)](raw)) > horizon:
            ts = nxt if nxt - ts <= ahead else ts + ahead
    # recorded: old[start:] and ts (every entry of old when start <= 0)
    start = n - burst + 1
    state = (raw[start << 3 :] if start > 0 else raw) + PACK_ONE(ts)
    table.current[ident] = state  # MemoryTable.put, inlined
    lasting = table.lasting
    if lasting and ident in lasting:
        lasting[ident] = state
    if ts > table.keep_after_ms:
        table.keep(ident, state, ts + window)
    if start >= 0:  # ``burst`` entries: next_allowed, its newest entry ``ts`` not before
        # ``at`` (so the next request is allowed one interval after ``ts``) and within
        # the window (which is positive), so the kept entries of old decide
        horizon = (ts if ts < now_ms else now_ms) - window
        if start == n or (
            AT(raw, start << 3)[0] > horizon
            and min(UNPACK_FROM[n - start](raw, start << 3)) > horizon
        ):
            until = ts + interval
            if until > now_ms:
                return until
    return None


def _apply_histories(
    dom: Domain, ident: bytes, ts: float, now_ms: float, ahead: float
) -> float | None:
    """The history rule for every rule of the domain; the latest "next allowed" wins.

    Debt: a request the master learns of after the time its identifier was next allowed
    had already passed it (a gatekeeper decided before the DELAY_UNTIL reached it) is
    recorded at the time it should have been served, as a DELAYED request is recorded
    at its delayed time, so each such request moves the next allowed time on by one
    interval instead of being forgiven. A gatekeeper that was informed in time never
    sends such a request, so for it nothing changes (``history-literal`` skips this).

    The rule is applied at the message's own time when the master is behind it (a
    queue, a busy loop): an instant master would have seen it then. Applied at the later
    ``now`` instead, ``start = max(now, last)`` would push DELAY_UNTIL back by the lag
    and throttle requests an instant master allows.

    What the rules share is paid for once. Every rule records the same timestamp, so
    each rule's state is the newest ``burst`` of one sequence. With the rules in order
    of burst, then window, longest first (``Domain.hot``), rules of one burst normally
    hold the very same object: this function writes one object to all of them. Such a
    rule decides nothing the rule before it has not: with the same timestamps and
    burst, a history is full when its oldest kept entry is within its window, so the
    longer window is full whenever the shorter one is, and its interval, a window over
    the same burst, is the longer too. Its state is written and nothing else is done for
    it. A state that is not the same (a rule added by a reload, one forgotten on its own
    window's expiry, one read from Redis) is judged on its own.

    The memory store's packed states are read as the one-rule path reads them: single
    timestamps where needed (``AT``), unpacked only to find the oldest of a history
    that may be full. Tuples (Redis, the original layout) go to ``_apply_tuples``.

    Twin of smockron.core.history.served_at, recorded and next_allowed, inlined as in
    the one-rule path (compared in tests/core/test_twins.py and
    tests/master/test_engine_twins.py)."""
    if not dom.packed:
        return _apply_tuples(dom, ident, ts, now_ms, ahead)
    debt = dom.debt
    leads: list[tuple[Stored, int, list[Hot]]] = []
    """The rules that decide, each with its state as stored, its length and its group:
    itself first, then the rules that follow it (its state and burst, their windows no
    longer)."""
    group: list[Hot] = []
    due = ts
    prev_raw: Stored = b""
    prev_burst = 0
    for rule in dom.hot:
        table, window, interval, burst, _tol = rule
        raw = table.current.get(ident) or table.recall(ident) or b""
        if raw is not prev_raw and raw == prev_raw:
            raw = prev_raw  # the same object from now on
        if raw is prev_raw and burst == prev_burst:
            group.append(rule)  # decided by the rule before it
            continue
        group = [rule]
        n = len(raw) >> 3
        leads.append((raw, n, group))
        prev_raw, prev_burst = raw, burst
        if debt and n >= burst:  # served_at
            last = AT(raw, (n - 1) << 3)[0]
            nxt = last + interval
            horizon = last - window
            if nxt > due and AT(raw, 0)[0] > horizon and min(UNPACK[len(raw)](raw)) > horizon:
                due = nxt
    if debt:
        ts = due if due - ts <= ahead else ts + ahead
    at = ts if ts < now_ms else now_ms
    until = now_ms
    packed_ts = PACK_ONE(ts)
    for raw, n, group in leads:
        _table, lead_window, interval, burst, _tol = group[0]
        start = n - burst + 1  # recorded: the kept bytes and ts (all of raw when start <= 0)
        state = (raw[start << 3 :] if start > 0 else raw) + packed_ts
        for rule in group:  # the lead, then its followers: the same state
            table = rule[0]
            table.current[ident] = state  # MemoryTable.put, inlined
            lasting = table.lasting
            if lasting and ident in lasting:
                lasting[ident] = state
            if ts > table.keep_after_ms:  # a timestamp ahead: keep the state longer
                table.keep(ident, state, ts + rule[1])
        # next_allowed: a history holds at most ``burst`` timestamps, so it throttles
        # when it has ``burst`` of them all within the window; its newest is ``ts``,
        # not before ``at`` (and so within the window, which is positive), so the next
        # request is allowed one interval after ``ts`` if the kept entries are all
        # within the window too (the oldest first: a cheap "not full").
        if start >= 0 and ts + interval > until:
            horizon = at - lead_window
            if start == n or (
                AT(raw, start << 3)[0] > horizon
                and min(UNPACK_FROM[n - start](raw, start << 3)) > horizon
            ):
                until = ts + interval
    return until if until > now_ms else None  # else allowed now


def _apply_tuples(
    dom: Domain, ident: bytes, ts: float, now_ms: float, ahead: float
) -> float | None:
    """``_apply_histories`` for tables of tuples (Redis, the original layout, a table
    that notes each ``put``): the same steps, on tuples, each state written with
    ``put``; rules of one burst hold the very same tuple."""
    debt = dom.debt
    leads: list[tuple[State, list[Hot]]] = []
    group: list[Hot] = []
    due = ts
    prev_old: State = ()
    prev_burst = 0
    for rule in dom.hot:
        table, window, interval, burst, _tol = rule
        old: State = table.current.get(ident) or table.recall(ident) or ()
        if old is not prev_old and old == prev_old:
            old = prev_old  # the same object from now on
        if old is prev_old and burst == prev_burst:
            group.append(rule)  # decided by the rule before it
            continue
        group = [rule]
        leads.append((old, group))
        prev_old, prev_burst = old, burst
        if debt and len(old) >= burst:  # served_at
            last = old[-1]
            nxt = last + interval
            horizon = last - window
            if nxt > due and old[0] > horizon and min(old) > horizon:
                due = nxt
    if debt:
        ts = due if due - ts <= ahead else ts + ahead
    at = ts if ts < now_ms else now_ms
    until = now_ms
    for old, group in leads:
        _table, lead_window, interval, burst, _tol = group[0]
        n = len(old)
        start = n - burst + 1  # recorded: old[start:] and ts (all of old when start <= 0)
        new = (*old[start:], ts) if start > 0 else (*old, ts)
        for rule in group:  # the lead, then its followers: the same state
            table = rule[0]
            table.put(ident, new)
            if ts > table.keep_after_ms:  # a timestamp ahead: keep the state longer
                table.keep(ident, new, ts + rule[1])
        if start >= 0 and ts + interval > until:  # next_allowed, as above
            horizon = at - lead_window
            if start == n or (old[start] > horizon and min(old[start:]) > horizon):
                until = ts + interval
    return until if until > now_ms else None


def apply_gcra(dom: Domain, ident: bytes, ts: float, now_ms: float) -> float | None:
    """GCRA for every rule of the domain; the latest DELAY_UNTIL wins.

    A message the master takes more than ``ON_TIME_MS`` after its own time (its queue, a
    gatekeeper's backlog, within the skew tolerance) is applied at that time, as an
    instant master would have applied it: taken at ``now``, a second's worth arriving
    together would be charged as a burst. One on time is applied at ``now``, as the
    original master's formula does. What is published is what lies after ``now``.

    Twin of smockron.core.gcra.gcra_update and expires_at, inlined (compared in
    tests/master/test_engine_twins.py)."""
    at = ts if now_ms - ts > ON_TIME_MS else now_ms
    t = ts if ts > at else at
    until = now_ms
    if dom.scalar:  # the memory store's tables: each state its one float
        for table, window, interval, _burst, tolerance in dom.hot:
            value = table.current.get(ident)
            if value is None:
                value = table.recall(ident)
            floor = t - tolerance
            value = (floor if value is None or value < floor else value) + interval
            table.current[ident] = value  # MemoryTable.put, inlined
            lasting = table.lasting
            if lasting and ident in lasting:
                lasting[ident] = value
            if value > table.keep_after_ms:  # far ahead: keep the state longer
                table.keep(ident, value, value + window)
            if value > until:
                until = value
        return until if until > now_ms else None
    for table, window, interval, _burst, tolerance in dom.hot:  # tuples (Redis, original)
        state = table.current.get(ident) or table.recall(ident)
        floor = t - tolerance
        value = (floor if not state or state[0] < floor else state[0]) + interval
        state = (value,)
        table.put(ident, state, t)  # ``t``: the original layout replays the step
        if value > table.keep_after_ms:  # far ahead: keep the state longer
            table.keep(ident, state, value + window)
        if value > until:
            until = value
    return until if until > now_ms else None
