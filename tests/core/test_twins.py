"""Each inlined or compiled copy of a core algorithm against the core function it copies.

- the master's history rule (``smockron.master.apply``: ``apply_history``, the one-rule
  copy, and ``_apply_histories``) against :mod:`smockron.core.history`, messages decoded by the
  compiled accounting decoder where it is built;
- the gatekeeper's first line (``Decider.decide``'s one-rule copy, ``line_admit`` for
  several rules, and DELAY_UNTILs applied by the compiled ``_tablefast`` where built)
  against :func:`smockron.core.gcra.gcra_update`, of which it is the ``tat`` form
  (``tat = V + tolerance``).

The cluster's compiled checks (``_localfast``) are compared with
:func:`smockron.core.algorithms.check` in tests/cluster/test_local.py, the accounting
decoders with each other in tests/wire/test_accounting_twins.py.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from smockron.core.gcra import gcra_update
from smockron.core.history import next_allowed, recorded, served_at
from smockron.core.rules import Rule
from smockron.gatekeeper._decider import Decider, Verdict
from smockron.gatekeeper._firstline import Line, line_admit
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores.base import Scope
from smockron.master.stores.memory import MemoryStore
from smockron.wire.codec import ACCEPTED, DELAYED, control_frames, encode_accounting, topic

T0 = 1_700_000_000_000
TOLERANCE = 2000

rules = st.builds(Rule, st.sampled_from([0.5, 1.0, 4.0, 10.0, 100.0]), st.integers(1, 6))
steps = st.lists(
    st.tuples(
        st.integers(0, 1500) | st.sampled_from([0, 10, 100, 250, 500, 1000, 2000, 4000]),
        st.integers(0, TOLERANCE),  # DELAYED: how much later than received it is accounted
        st.none() | st.integers(0, 2000),  # DELAYED: by how much
        st.sampled_from([b"a", b"b"]),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    domain_rules=st.lists(rules, min_size=1, max_size=3, unique=True),
    debt=st.booleans(),
    ahead=st.sampled_from([60_000, 1000, 300]),
    messages=steps,
)
def test_engine_applies_core_history(
    domain_rules: list[Rule],
    debt: bool,
    ahead: int,
    messages: list[tuple[int, int, int | None, bytes]],
) -> None:
    """The engine's history rule, inlined for one rule, is core.history's: same
    DELAY_UNTILs for any messages, ACCEPTED or DELAYED (received before ``now``).

    Messages are accounted no later than their own time: the store forgets a state
    once it has expired at ``now``, so a master more than a short rule's window behind
    forgets what core.history, applied at the message's time, still counts."""
    algorithm = "history" if debt else "history-literal"
    engine = Engine(
        {"api": DomainPolicy(tuple(domain_rules), algorithm)},
        MemoryStore(),
        skew_tolerance_ms=TOLERANCE,
        max_delay_ahead_ms=ahead,
    )
    states: dict[bytes, list[tuple[float, ...]]] = {}
    received = now = T0
    for gap, lag, delay, ident in messages:
        # a master's clock never goes back: a message received after a DELAYED one was
        # accounted (``now`` moved on by its lag) is received no earlier than that
        received = max(received + gap, now)
        if delay is None:
            frames = encode_accounting("api", ACCEPTED, ident, received)
            ts = float(received)
            now = received
        else:
            frames = encode_accounting("api", DELAYED, ident, received, received + delay)
            ts = float(received + min(delay, ahead))  # a DELAYED time is clamped to ahead
            now = received + min(lag, delay, ahead)
        old = states.get(ident, [() for _ in domain_rules])
        if debt:
            ts = served_at(domain_rules, old, ts, ahead)
        new = [recorded(state, ts, rule) for rule, state in zip(domain_rules, old, strict=True)]
        states[ident] = new
        at = min(ts, now)
        untils = [
            next_allowed(state, at, rule) for rule, state in zip(domain_rules, new, strict=True)
        ]
        until = max((u for u in untils if u is not None), default=None)
        expected = (
            []
            if until is None or until <= now
            else [control_frames(topic("api"), ident, math.ceil(until))]
        )
        assert engine.process([frames], now) == expected


@pytest.mark.parametrize("debt", [True, False])
@pytest.mark.parametrize(
    ("history", "ts"),
    [
        ((10_000, 6_000, 10_500), 10_600),  # an older entry after the first: not full
        ((10_000, 9_000, 10_500), 10_600),  # all within the window: full
        ((6_000, 10_000, 10_500), 10_600),  # the first entry outside it: not full
        ((10_000, 6_000, 10_500), 9_000),  # a message older than the newest entry
        ((9_000, 10_000, 6_000), 10_600),  # the kept entries: an older one after the first
    ],
)
def test_one_rule_reads_an_out_of_order_history_as_core(
    history: tuple[int, ...], ts: int, debt: bool
) -> None:
    """A history recorded out of order (a DELAYED time, then an earlier one) is full
    only if every entry is within the window, not only its first: the one-rule path reads
    single timestamps and unpacks the history whole only to find its oldest."""
    rule = Rule(1.0, 3)  # window 3 s, interval 1 s
    store = MemoryStore(now_ms=T0)
    engine = Engine(
        {"api": DomainPolicy((rule,), "history" if debt else "history-literal")},
        store,
        skew_tolerance_ms=TOLERANCE,
    )
    old = tuple(float(T0 + t) for t in history)
    at = float(T0 + ts)
    table = store.table(Scope("api", rule, "history"))
    table.tick(at)  # its generations start now: the state is not rotated out
    table.put(b"a", old)
    served = served_at([rule], [old], at, engine.max_delay_ahead_ms) if debt else at
    until = next_allowed(recorded(old, served, rule), at, rule)
    expected = (
        []
        if until is None or until <= at
        else [control_frames(topic("api"), b"a", math.ceil(until))]
    )
    frames = encode_accounting("api", ACCEPTED, b"a", T0 + ts)
    assert engine.process([frames], T0 + ts) == expected
    assert table.get(b"a") == recorded(old, served, rule)  # the time it was served at


# fmt: off
SHORTER_BURST_CASE = [
    (150, 415), (58, 611), (48, None), (166, 602), (195, 590), (88, None), (160, None),
    (148, None), (120, None), (107, 477), (189, None), (59, 972), (108, None), (53, None),
    (83, None), (69, None), (149, 512), (22, None), (46, None), (69, 166), (21, None),
    (26, 404), (85, 353), (155, 10), (12, 707), (90, 318), (194, 617), (78, None),
    (105, None), (23, 793), (57, None), (186, None), (27, None),
]
# fmt: on
"""Messages on which a longer burst's minimum, taken for a shorter burst's state, changes
a DELAY_UNTIL (found by a search; hypothesis's own examples rarely reach it)."""


@settings(max_examples=500, deadline=None)
@example(
    domain_rules=[Rule(5.0, 6), Rule(2.0, 2)],
    added_after=30,
    messages=SHORTER_BURST_CASE,
)
@given(
    domain_rules=st.lists(
        st.builds(Rule, st.sampled_from([1.0, 2.0, 5.0]), st.sampled_from([1, 2, 3, 6])),
        min_size=2,
        max_size=5,
        unique=True,
    ),
    added_after=st.integers(0, 40),
    messages=st.lists(
        st.tuples(st.integers(0, 199), st.none() | st.integers(0, 1000)),
        min_size=1,
        max_size=60,
    ),
)
def test_shared_history_states_are_each_rules_own(
    domain_rules: list[Rule], added_after: int, messages: list[tuple[int, int | None]]
) -> None:
    """Several history rules of the memory store share what they can (rules of one
    burst hold one ``bytes`` object, a shorter burst's timestamps are read as the end of
    a longer one's): each rule's stored state is still core.history's for that rule
    alone, also for a rule added by a reload after others have recorded (its state is
    no end of theirs), and the DELAY_UNTILs are core's. Requests come more often than
    the shortest window (200 ms), so the store forgets no state core still holds."""
    first, added = domain_rules[:-1], domain_rules[-1]
    store = MemoryStore()
    engine = Engine({"api": DomainPolicy(tuple(first), "history")}, store)
    active = list(first)
    states: dict[tuple[Rule, bytes], tuple[float, ...]] = {}
    now = T0
    ident = b"a"
    for k, (gap, delay) in enumerate(messages):
        if k == added_after:
            active.append(added)
            engine.configure({"api": DomainPolicy(tuple(active), "history")})
        now += gap
        if delay is None:
            frames = encode_accounting("api", ACCEPTED, ident, now)
        else:  # accounted when it was delayed: its timestamp ahead, out of order
            frames = encode_accounting("api", DELAYED, ident, now, now + delay)
        old = [states.get((rule, ident), ()) for rule in active]
        ts = served_at(active, old, float(now + (delay or 0)), 60_000)
        until = None
        for rule, state in zip(active, old, strict=True):
            new = states[rule, ident] = recorded(state, ts, rule)
            nxt = next_allowed(new, min(ts, now), rule)
            if nxt is not None and (until is None or nxt > until):
                until = nxt
        expected = (
            []
            if until is None or until <= now
            else [control_frames(topic("api"), ident, math.ceil(until))]
        )
        assert engine.process([frames], now) == expected
        for rule in active:
            table = store.table(Scope("api", rule, "history"))
            assert table.get(ident) == states[rule, ident]


first_line_steps = st.lists(
    st.tuples(
        st.integers(0, 800),  # ms since the previous request
        st.sampled_from([b"a", b"b"]),
        st.none() | st.integers(1, 4000),  # a DELAY_UNTIL this far ahead arrives first
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    domain_rule=rules,
    algorithm=st.sampled_from(["gcra", "history"]),
    max_delay=st.integers(0, 3000),
    requests=first_line_steps,
)
def test_first_line_is_gcra(
    domain_rule: Rule,
    algorithm: str,
    max_delay: int,
    requests: list[tuple[int, bytes, int | None]],
) -> None:
    """A one-rule domain's first line decides as core GCRA over ``V = tat - tol``:
    accept when ``V <= now``, else delay to ``V`` (within ``max_delay``) or reject; an
    accepted or delayed request moves ``V`` as ``gcra_update`` at the time it passes,
    a DELAY_UNTIL ``X`` (applied by the compiled table where built) to at least ``X``.
    A history domain's line is GCRA with one request less of burst (a cold identifier
    gets ``burst`` requests at once, as the history rule gives)."""
    assume(algorithm == "gcra" or domain_rule.burst > 1)
    rule = domain_rule if algorithm == "gcra" else Rule(domain_rule.rate, domain_rule.burst - 1)
    decider = Decider(max_delay_ms=max_delay, max_delayed=10**6)
    line = Line.of(algorithm, [domain_rule])
    assert line is not None
    decider.set_line(b"api", line)
    values: dict[bytes, float | None] = {}
    now = T0
    for gap, ident, control in requests:
        now += gap
        value = values.get(ident)
        if control is not None:
            decider.control(b"api", ident, now + control, now)
            value = now + control if value is None else max(value, now + control)
        decision = decider.decide(b"api", ident, now)
        if value is None or value <= now:
            assert decision.verdict is Verdict.ACCEPT
            value = gcra_update(value, now, now, rule).value
        elif math.ceil(value) - now <= max_delay:
            assert (decision.verdict, decision.until_ms) == (Verdict.DELAY, math.ceil(value))
            value = gcra_update(value, value, now, rule).value
            decider.release()
        else:
            assert (decision.verdict, decision.until_ms) == (Verdict.REJECT, math.ceil(value))
        values[ident] = value


@settings(max_examples=300)
@given(
    domain_rules=st.lists(rules, min_size=1, max_size=4, unique=True),
    offsets=st.lists(st.none() | st.integers(-5000, 5000), min_size=4, max_size=4),
    until=st.integers(0, 5000),
    now=st.integers(0, 5000),
)
def test_line_admit_is_gcra_per_rule(
    domain_rules: list[Rule], offsets: list[int | None], until: int, now: int
) -> None:
    """Several rules: a request passes when every rule's GCRA allows it (the latest
    ``V``), and each rule's ``V`` then moves as ``gcra_update`` at that time."""
    line = Line.of("gcra", domain_rules)
    assert line is not None
    values = [None if o is None else float(now + o) for o in offsets[: len(domain_rules)]]
    tats = None
    if any(v is not None for v in values):
        tats = tuple(
            -math.inf if v is None else v + tol
            for v, tol in zip(values, line.tolerances, strict=True)
        )
    else:
        values = [None] * len(domain_rules)
    if until > now:  # the master's DELAY_UNTIL: the fastest rule is used up until then
        k = line.fastest
        values[k] = until if values[k] is None else max(values[k] or 0.0, until)
    at = max([float(now), *(v for v in values if v is not None)])
    got_at, got = line_admit(line, tats, until, now)
    assert got_at == at
    for value, rule, tol, tat in zip(values, domain_rules, line.tolerances, got, strict=True):
        assert tat - tol == gcra_update(value, at, at, rule).value
