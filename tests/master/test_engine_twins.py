"""The engine's inlined GCRA against :func:`smockron.core.gcra.gcra_update`, and its
stored states against core's, for any messages (the history rule's DELAY_UNTILs are
compared in tests/core/test_twins.py); and its inlined memory-table reads and writes
against ``MemoryTable.get`` and ``put``."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from smockron.core.gcra import expires_at, gcra_update
from smockron.core.history import recorded, served_at
from smockron.core.rules import Rule
from smockron.master.apply import ON_TIME_MS
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores.base import Scope, State
from smockron.master.stores.memory import MemoryStore, MemoryTable, scope_expiry
from smockron.wire.codec import ACCEPTED, DELAYED, control_frames, encode_accounting, topic

T0 = 1_700_000_000_000
TOLERANCE = 2000

rules = st.builds(Rule, st.sampled_from([0.5, 1.0, 4.0, 10.0, 100.0]), st.integers(1, 6))
long_rules = st.builds(Rule, st.sampled_from([0.5, 1.0]), st.integers(3, 6))
"""Windows of 3 s and more: a master taking a message up to 1.5 s late still holds the
state (the store forgets a state once it has expired at ``now``, core never does)."""
steps = st.lists(
    st.tuples(
        st.integers(0, 1500) | st.sampled_from([0, 0, 10, 100, 250, 500, 1000]),
        st.integers(0, 1500) | st.sampled_from([0, 500, 501]),  # how late the master is
        st.sampled_from([b"a", b"b", b"c"]),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(domain_rules=st.lists(long_rules, min_size=1, max_size=4, unique=True), messages=steps)
def test_engine_applies_core_gcra(
    domain_rules: list[Rule], messages: list[tuple[int, int, bytes]]
) -> None:
    """Same DELAY_UNTILs and stored values as core GCRA, on time or late (a message
    older than ``ON_TIME_MS`` is applied at its own time)."""
    store = MemoryStore()
    engine = Engine(
        {"api": DomainPolicy(tuple(domain_rules), "gcra")}, store, skew_tolerance_ms=TOLERANCE
    )
    values: dict[bytes, list[float | None]] = {}
    received = T0
    for gap, lag, ident in messages:
        received += gap
        now = received + lag
        ts = float(received)
        at = ts if now - ts > ON_TIME_MS else float(now)
        old = values.get(ident, [None for _ in domain_rules])
        new = [gcra_update(v, ts, at, r).value for r, v in zip(domain_rules, old, strict=True)]
        values[ident] = list(new)
        until = max((v for v in new if v > now), default=None)
        expected = [] if until is None else [control_frames(topic("api"), ident, math.ceil(until))]
        frames = encode_accounting("api", ACCEPTED, ident, received)
        assert engine.process([frames], now) == expected
        for rule, value in zip(domain_rules, new, strict=True):
            table = store.table(Scope("api", rule, "gcra"))
            assert table.get(ident) == (value,)
            assert expires_at(value, rule) == value + rule.window_ms


history_rules = st.builds(Rule, st.sampled_from([0.5, 1.0]), st.integers(6, 8))
"""Windows of 6 s and more, longer than the messages of one example span: nothing expires
(the store forgets expired states, core keeps them)."""


@settings(max_examples=60, deadline=None)
@given(
    domain_rules=st.lists(history_rules, min_size=1, max_size=4, unique=True),
    messages=st.lists(
        st.tuples(st.sampled_from([0, 0, 0, 1, 10, 90]), st.sampled_from([b"a", b"b", b"c"])),
        min_size=1,
        max_size=60,
    ),
)
def test_engine_stores_core_histories(
    domain_rules: list[Rule], messages: list[tuple[int, bytes]]
) -> None:
    """Each rule's stored history is core's ``recorded`` after ``served_at``, for
    messages of one batch, those of the same millisecond included (they share one
    timestamp object)."""
    store = MemoryStore()
    engine = Engine({"api": DomainPolicy(tuple(domain_rules))}, store, skew_tolerance_ms=10_000)
    states: dict[bytes, list[tuple[float, ...]]] = {}
    received = T0
    batch: list[list[bytes]] = []
    for gap, ident in messages:
        received += gap
        old = states.get(ident, [() for _ in domain_rules])
        ts = served_at(domain_rules, old, float(received), engine.max_delay_ahead_ms)
        states[ident] = [recorded(s, ts, r) for r, s in zip(domain_rules, old, strict=True)]
        batch.append(encode_accounting("api", ACCEPTED, ident, received))
    engine.process(batch, received)
    for ident, expected in states.items():
        for rule, state in zip(domain_rules, expected, strict=True):
            assert store.table(Scope("api", rule, "history")).get(ident) == state


def test_one_timestamp_object_per_millisecond() -> None:
    """Histories of tuples (the Redis and original-layout tables) of requests taken in
    the same millisecond hold one float between them: a million identifiers' histories
    then hold far fewer objects (memory, cache)."""
    store = CalledStore()
    rule = Rule(1.0, 5)
    engine = Engine({"api": DomainPolicy((rule,))}, store)
    engine.process([encode_accounting("api", ACCEPTED, b"id%d" % i, T0) for i in range(3)], T0)
    table = store.table(Scope("api", rule, "history"))
    firsts = [state[0] for i in range(3) if (state := table.get(b"id%d" % i)) is not None]
    assert firsts == [float(T0)] * 3
    assert firsts[0] is firsts[1] is firsts[2]
    assert type(firsts[0]) is float  # not the int ``now`` given to process


def _tuples(table: MemoryTable) -> list[dict[bytes, State]]:
    """A table's generations and lasting states, as tuples."""
    return [
        dict(table.states(list(d.items()))) for d in (table.current, table.previous, table.lasting)
    ]


class CalledTable(MemoryTable):
    """A memory table the engine does not count as ``plain`` (a subclass, as the Redis
    tables are): it calls ``get`` and ``put`` instead of their inlined twins."""

    __slots__ = ()


class CalledStore(MemoryStore):
    """A memory store of :class:`CalledTable`."""

    def _new_table(self, scope: Scope) -> MemoryTable:
        return CalledTable(scope.rule.window_ms, scope_expiry(scope), self.reclaimer)


@settings(max_examples=80, deadline=None)
@given(
    algorithm=st.sampled_from(["history", "history-literal", "gcra"]),
    domain_rules=st.lists(rules, min_size=1, max_size=3, unique=True),
    messages=st.lists(
        st.tuples(
            st.sampled_from([0, 1, 10, 90, 400, 3000]),  # gaps that rotate generations
            st.none() | st.sampled_from([100, 5000, 40_000]),  # DELAYED: lasting states
            st.sampled_from([b"a", b"b", b"c"]),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_inlined_memory_table_is_get_and_put(
    algorithm: str, domain_rules: list[Rule], messages: list[tuple[int, int | None, bytes]]
) -> None:
    """The hot path's inlined ``MemoryTable.get`` and ``put`` (plain memory tables) leave
    every generation and lasting state as the methods do, and publish the same."""
    policy = {"api": DomainPolicy(tuple(domain_rules), algorithm)}
    inlined, called = MemoryStore(now_ms=T0), CalledStore(now_ms=T0)
    engines = [Engine(policy, store, skew_tolerance_ms=TOLERANCE) for store in (inlined, called)]
    assert [e.topics[topic("api")].plain for e in engines] == [True, False]
    received = T0
    for gap, delay, ident in messages:
        received += gap
        frames = (
            encode_accounting("api", ACCEPTED, ident, received)
            if delay is None
            else encode_accounting("api", DELAYED, ident, received, received + delay)
        )
        assert engines[0].process([frames], received) == engines[1].process([frames], received)
        for scope in engines[0].scopes("api"):
            a, b = inlined.table(scope), called.table(scope)
            assert [a.packed, b.packed] == [algorithm != "gcra", False]
            assert [a.scalar, b.scalar] == [algorithm == "gcra", False]
            assert _tuples(a) == _tuples(b)
