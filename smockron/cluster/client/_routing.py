"""The client's copy of the cluster's hash ring: which node owns a check.

A check sent to a node that does not own it costs that node a forward (a second gRPC
call, node to owner) and the caller a second round trip. A client that knows the ring
sends each check to its owner instead. It learns the node list from any node's
HealthCheck (``local_peers`` and ``region_peers``: every node's gRPC address, the names
the nodes hash) and builds the ring the nodes build (smockron.core.hashring, the same
hash and replicas), so both agree on every owner.

The copy follows the cluster three ways:

- every ``refresh`` seconds it asks again (nodes joining or leaving);
- every answer names the node that decided it (metadata ``owner``); one that is not the
  node the client picked means the ring differs, and a refresh is made at once (at most
  one a second). If after a refresh the answers still disagree, the nodes hash with
  another function (``--peer-picker-hash``, e.g. ``fnv1a`` in Gubernator mode): the
  client switches to the one of smockron.core.hashring.HASHES that places the keys it saw
  on the nodes that answered them;
- a node that cannot be reached is left out of the client's ring for ``down_for``
  seconds: its keys go to the node that takes them over when it leaves, which is where
  the nodes send them once they notice it is gone.

A node that lists no peers (Gubernator, whose HealthCheck gives a count only) leaves
the ring empty: every check then goes to the address the client was given.

``Route`` is one call's way to its owners, the same for both clients: it names the parts
to send and takes what came of each; the sync client sends the parts on threads, the
asyncio one as tasks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

from smockron.cluster.model import RateLimitRequest, RateLimitResponse
from smockron.core.hashring import DEFAULT_REPLICAS, HASHES, HashRing
from smockron.errors import ClientUnavailable

REFRESH = 5.0
"""Seconds between two HealthCheck calls that re-read the node list."""
DOWN_FOR = 1.0
"""Seconds an unreachable node stays out of the client's ring before it is tried again."""
MISMATCH_REFRESH = 1.0
"""At least this many seconds between two refreshes caused by answers from other owners."""
ATTEMPTS = 3
"""Nodes a routed call tries: its owner, then the next ones as they fail to answer."""
HEALTH_TIMEOUT = 2.0
"""At most this long (seconds) to ask a node for the node list."""
_SAMPLES = 64
_MIN_SAMPLES = 8
"""Keys answered elsewhere needed before another hash is tried."""


class OwnerRing:
    """Owner lookups (``owner``) for a client, and when to re-read the node list.

    Safe to share between threads: the ring is swapped whole (HashRing.set_nodes), the
    rest is bookkeeping where a lost update costs at most an extra refresh."""

    def __init__(
        self,
        *,
        replicas: int = DEFAULT_REPLICAS,
        hash: str = "fnv1a-mix",
        refresh: float = REFRESH,
        down_for: float = DOWN_FOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if refresh <= 0:
            raise ValueError(f"ring refresh must be positive seconds, got {refresh}")
        self._replicas = replicas
        self.hash = hash
        self._ring = HashRing((), replicas, hash=hash)
        self._refresh = refresh
        self._down_for = down_for
        self._clock = clock
        self.nodes: tuple[str, ...] = ()
        """Every node the cluster listed, reachable or not."""
        self.down: dict[str, float] = {}
        """Unreachable nodes and when to try each again."""
        self.learned = False
        """True once a node answered a HealthCheck (a list, maybe empty)."""
        self._next = 0.0
        """When ``due`` turns true: the next refresh or the end of a node's time out."""
        self._scheduled = 0.0
        """When the next refresh is due."""
        self._last_mismatch_refresh = -MISMATCH_REFRESH
        self._samples: dict[str, str] = {}
        """Keys answered by another node than the one picked -> that node."""
        self.seed = ""
        """The ring's name for the node at the client's own address, when known."""
        self.alone = True
        """No node in the ring but the one at the client's own address (or none): every
        check goes to that address, where ``Route`` would send it, for less."""
        self._lock = threading.Lock()
        self.refreshes = 0
        """HealthCheck answers taken in (for tests and benchmarks)."""

    def owner(self, key: str) -> str | None:
        """The node to send ``key`` to, or None: no node known, send it anywhere."""
        try:
            return self._ring.owner(key)
        except LookupError:
            return None

    def due(self) -> bool:
        """Something to do before the next check: a refresh, or a node to try again."""
        return self._clock() >= self._next

    def claim(self) -> bool:
        """Whether the caller should refresh now. Puts expired time-outs back in the ring;
        the one thread (or task) given True must call ``learn`` or ``failed``."""
        now = self._clock()
        if self.down and any(until <= now for until in self.down.values()):
            self.down = {n: until for n, until in self.down.items() if until > now}
            self._rebuild()
        if not self._lock.acquire(blocking=False):
            return False
        refresh_at = self._scheduled
        if now < refresh_at:
            self._lock.release()
            self._next = min(refresh_at, *self.down.values()) if self.down else refresh_at
            return False
        self._next = now + self._refresh  # other threads: not due while this one asks
        return True

    def learn(self, nodes: Iterable[str], seed: str = "") -> None:
        """A node's answer: the full node list (empty: route nothing); ``seed``: the
        name of the node at the client's own address."""
        self.seed = seed
        self.nodes = tuple(sorted(set(nodes)))
        self.down = {n: until for n, until in self.down.items() if n in self.nodes}
        self._rebuild()
        self._match_samples()
        self.learned = True
        self.refreshes += 1
        self._done(self._clock() + self._refresh)

    def failed(self) -> None:
        """No node answered the HealthCheck: keep the ring, ask again in a second."""
        self._done(self._clock() + min(self._refresh, 1.0))

    def _done(self, refresh_at: float) -> None:
        self._scheduled = refresh_at
        self._next = min(refresh_at, *self.down.values()) if self.down else refresh_at
        self._lock.release()

    def mark_down(self, node: str) -> None:
        """``node`` did not answer: its keys go to their next owner for ``down_for``."""
        until = self._clock() + self._down_for
        self.down = {**self.down, node: until}
        self._rebuild()
        self._next = min(self._next, until)

    def observe(self, key: str, picked: str, owner: str | None) -> None:
        """An answer to a check sent to ``picked`` says ``owner`` decided it."""
        if not owner or owner == picked:
            return
        if len(self._samples) < _SAMPLES:
            self._samples[key] = owner
        now = self._clock()
        if now - self._last_mismatch_refresh >= MISMATCH_REFRESH:
            self._last_mismatch_refresh = now
            self._scheduled = now
            self._next = now

    def _rebuild(self) -> None:
        live = [n for n in self.nodes if n not in self.down]
        self._ring.set_nodes(live)
        self.alone = not live or live == [self.seed]

    def _match_samples(self) -> None:
        """Switch to the hash that places the keys answered elsewhere where they were
        answered, when the current one does not (see the module docstring)."""
        samples, self._samples = self._samples, {}
        live = [n for n in self.nodes if n not in self.down]
        if not samples or not live or not set(samples.values()) <= set(live):
            return
        if len(samples) < _MIN_SAMPLES or all(self._ring.owner(k) == o for k, o in samples.items()):
            return  # too few to tell a hash from chance (a third of keys match any hash)
        for name in HASHES:
            if name == self.hash:
                continue
            ring = HashRing(live, self._replicas, hash=name)
            if all(ring.owner(k) == o for k, o in samples.items()):
                self.hash = name
                self._ring = HashRing((), self._replicas, hash=name)
                self._rebuild()
                return


Part = tuple[str | None, Sequence[RateLimitRequest]]
"""Requests to send together, and to whom: their owner, or None for the address the
client was given."""
Outcome = list[RateLimitResponse] | ClientUnavailable
"""What came of a part: its answers in order, or the error of an owner out of reach
(other errors are raised by the client as they come)."""
_NO_ANSWER = RateLimitResponse(error="no answer")


class Route:
    """One routed call, without I/O: the clients loop ``parts`` (send each part, in
    parallel) and ``take`` (what came of each) until ``take`` says every request is
    answered; the answers are then in ``answers``, in request order.

    An owner out of reach is marked down and its part goes to the requests' next owners,
    ``attempts`` owners in all; then its error is raised, or with ``fallback`` the last
    try goes to the client's own address (owner None), which forwards. An answer from
    another owner than the one picked is told to the ring (``OwnerRing.observe``)."""

    __slots__ = ("_fallback", "_groups", "_left", "_todo", "answers", "requests", "ring")

    def __init__(
        self,
        ring: OwnerRing,
        requests: Sequence[RateLimitRequest],
        attempts: int = ATTEMPTS,
        fallback: bool = False,
    ) -> None:
        self.ring = ring
        self.requests = requests
        self.answers: list[RateLimitResponse] = []
        self._left = attempts
        self._fallback = fallback
        self._todo: list[int] | None = None
        """The indexes of the requests not answered yet; None: all of them."""
        self._groups: dict[str | None, list[int]] = {}

    def parts(self) -> list[Part]:
        """What to send next: the unanswered requests by owner."""
        requests, todo = self.requests, self._todo
        if self._fallback and self._left == 1:
            groups: dict[str | None, list[int]] = {
                None: list(range(len(requests))) if todo is None else todo
            }
        elif len(requests) == 1:  # a lone check (the common case): no loop
            r = requests[0]
            groups = {self.ring.owner(f"{r.name}_{r.unique_key}"): [0]}
        else:
            owner = self.ring.owner
            groups = {}
            for i in range(len(requests)) if todo is None else todo:
                r = requests[i]
                groups.setdefault(owner(f"{r.name}_{r.unique_key}"), []).append(i)
        self._groups = groups
        if todo is None and len(groups) == 1:
            return [(next(iter(groups)), requests)]  # the whole call: no copy
        return [(owner, [requests[i] for i in idx]) for owner, idx in groups.items()]

    def take(self, outcomes: Sequence[Outcome]) -> bool:
        """What came of each of the last ``parts``; True once every request has its
        answer. Raises the error of a part that has no next owner to go to."""
        self._left -= 1
        got = outcomes[0] if outcomes else None
        if self._todo is None and type(got) is list and len(got) == len(self.requests):
            (owner,) = self._groups  # the whole call went to one node: its answers are all
            self._observe(owner, 0, got)
            self.answers = got
            return True
        if not self.answers:
            self.answers = [_NO_ANSWER] * len(self.requests)
        retry: list[int] = []
        answers = self.answers
        for (owner, idx), got in zip(self._groups.items(), outcomes, strict=True):
            if isinstance(got, ClientUnavailable):
                if owner is None or self._left < 1:
                    raise got
                self.ring.mark_down(owner)
                retry.extend(idx)
                continue
            self._observe(owner, idx[0], got)
            for i, resp in zip(idx, got, strict=True):
                answers[i] = resp
        if not retry:
            return True
        self._todo = sorted(retry)
        return False

    def _observe(self, owner: str | None, first: int, got: list[RateLimitResponse]) -> None:
        """Tell the ring when a part's answer names another owner than the one picked."""
        named = got[0].metadata.get("owner")
        if owner is not None and named and named != owner:
            self.ring.observe(self.requests[first].hash_key, owner, named)
