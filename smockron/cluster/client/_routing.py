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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from smockron.core.hashring import DEFAULT_REPLICAS, HASHES, HashRing

REFRESH = 5.0
"""Seconds between two HealthCheck calls that re-read the node list."""
DOWN_FOR = 1.0
"""Seconds an unreachable node stays out of the client's ring before it is tried again."""
MISMATCH_REFRESH = 1.0
"""At least this many seconds between two refreshes caused by answers from other owners."""
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

    def learn(self, nodes: Iterable[str]) -> None:
        """A node's answer: the full node list (empty: route nothing)."""
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
        self._ring.set_nodes(n for n in self.nodes if n not in self.down)

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
