"""Coalescing concurrent checks of one process into batched GetRateLimits calls.

A gRPC call costs the client a few hundred microseconds of CPU whatever it carries, and
one item costs a few microseconds; a process making many concurrent checks (an asyncio
server, a thread pool) pays the first per call. So at most one call per client is in
flight: checks made meanwhile wait in a queue and go together, in one call, as soon as
it returns (up to 1,000 per call, the server's limit). A lone check goes at once, so a
sequential caller waits no longer than without coalescing. Gubernator's own peers batch
between nodes the same way.

Both twins deliver to each waiter its own response, or the error of the call that
carried it. The check that finds no call in flight sends its own request straight away
(no queue, no task, no thread hand-off): a sequential caller pays nothing for coalescing.
A third, NativeCoalescer, is the thread twin's behaviour done inside the native channel
(smockron.cluster._nativeclient) with the GIL released.
"""

from __future__ import annotations

import asyncio
import threading
from _thread import LockType, allocate_lock
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from smockron.cluster.model import RateLimitRequest, RateLimitResponse

MAX_COALESCED = 1000
"""Requests in one coalesced call: the server's limit per GetRateLimits."""


class AsyncCoalescer:
    """For one event loop: ``await check(request)``; one call in flight at a time."""

    def __init__(
        self,
        call: Callable[[Sequence[RateLimitRequest]], Awaitable[list[RateLimitResponse]]],
        one: Callable[[RateLimitRequest], Awaitable[RateLimitResponse]] | None = None,
    ) -> None:
        self._call = call
        self._one = one or self._one_of_many
        """Sends a lone check (``call`` for one request, maybe by a cheaper path)."""
        self._queue: list[tuple[RateLimitRequest, asyncio.Future[RateLimitResponse]]] = []
        self._sending = False
        self.calls = 0
        """GetRateLimits calls made (checks / calls is the mean batch)."""

    async def check(self, request: RateLimitRequest) -> RateLimitResponse:
        if self._sending:
            future: asyncio.Future[RateLimitResponse] = asyncio.get_running_loop().create_future()
            self._queue.append((request, future))
            return await future
        self._sending = True
        self.calls += 1
        try:
            return await self._one(request)
        finally:  # whatever queued meanwhile goes next, also if this waiter was cancelled
            if self._queue:
                asyncio.get_running_loop().create_task(self._send())
            else:
                self._sending = False

    async def _one_of_many(self, request: RateLimitRequest) -> RateLimitResponse:
        return (await self._call([request]))[0]

    async def _send(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_COALESCED], self._queue[MAX_COALESCED:]
                self.calls += 1
                try:
                    responses = await self._call([request for request, _ in batch])
                except Exception as exc:  # every waiter of this call gets its error
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), response in zip(batch, responses, strict=True):
                    if not future.done():  # a waiter cancelled meanwhile: nothing to do
                        future.set_result(response)
        finally:
            self._sending = False


@dataclass(slots=True)
class _Slot:
    request: RateLimitRequest
    done: LockType = field(default_factory=allocate_lock)
    """Held from creation; released once the answer (or the lead) is in. A bare lock is
    the cheapest way to park a thread: an Event costs a Condition and a second lock."""
    response: RateLimitResponse | None = None
    error: BaseException | None = None
    lead: bool = False
    """Woken to take over sending (its own request is still queued)."""
    next: _Slot | None = None
    """The waiter of the same call to wake next: each answered waiter wakes the next as
    it wakes (a chain), rather than the sender waking them all at once, where they
    would wake into a held GIL and sleep again on it."""


class Coalescer:
    """For threads: ``check(request)`` blocks. The first caller to find no call in flight
    sends its own request; checks made meanwhile queue. Once its answer is in, the sender
    hands the sending over to the oldest waiter, which sends everything queued (itself
    first), so nobody waits for more than the call in flight and its own. The waiters a
    call answered wake one another in turn (``_Slot.next``): the GIL lets only one run at
    a time anyway, and each is woken once instead of twice."""

    def __init__(
        self,
        call: Callable[[Sequence[RateLimitRequest]], list[RateLimitResponse]],
        one: Callable[[RateLimitRequest], RateLimitResponse] | None = None,
    ) -> None:
        self._call = call
        self._one = one or (lambda request: call([request])[0])
        """Sends a lone check (``call`` for one request, maybe by a cheaper path)."""
        self._lock = threading.Lock()
        self._queue: list[_Slot] = []
        self._sending = False
        self.calls = 0

    def check(self, request: RateLimitRequest) -> RateLimitResponse:
        slot = _Slot(request)
        with self._lock:
            lead = not self._sending
            if lead:
                self._sending = True
                self.calls += 1
            else:
                slot.done.acquire()
                self._queue.append(slot)
        if lead:
            try:
                return self._one(request)
            finally:
                self._hand_over()
        slot.done.acquire()  # released: answered, or made the next sender
        if slot.lead:
            try:
                self._send(slot)
            finally:
                self._hand_over()
        elif slot.next is not None:
            slot.next.done.release()
        if slot.error is not None:
            raise slot.error
        assert slot.response is not None
        return slot.response

    def _send(self, mine: _Slot) -> None:
        """One call for the oldest queued checks, ``mine`` (the oldest) among them."""
        with self._lock:
            batch = self._queue[:MAX_COALESCED]
            del self._queue[:MAX_COALESCED]
            self.calls += 1
        try:
            responses = self._call([slot.request for slot in batch])
            if len(responses) != len(batch):
                raise ValueError(f"{len(responses)} responses for {len(batch)} requests")
        except BaseException as exc:  # delivered to every waiter, the sender included
            for slot in batch:
                slot.error = exc
            self._wake(batch, mine)
            return
        for slot, response in zip(batch, responses, strict=True):
            slot.response = response
        self._wake(batch, mine)

    @staticmethod
    def _wake(batch: list[_Slot], mine: _Slot) -> None:
        """Chain the answered waiters (see ``_Slot.next``) and wake the first."""
        others = [slot for slot in batch if slot is not mine]
        for slot, after in pairwise(others):
            slot.next = after
        if others:
            others[0].done.release()

    def _hand_over(self) -> None:
        with self._lock:
            if self._queue:  # the oldest waiter sends next
                heir = self._queue[0]
                heir.lead = True
                heir.done.release()
            else:
                self._sending = False


class NativeCoalescer:
    """For threads on the native channel: what Coalescer does (a lone check at once, the
    checks made meanwhile together in the next call, sent by the oldest of them, at most
    1,000 a call, each waiter answered or given its call's error), done inside
    smockron.cluster._nativeclient (``Channel.check``) with the GIL released: queueing,
    parking, sending and waking cost no Python and no GIL hand-off, and each check
    crosses as its values (the channel encodes and decodes the one item). ``check`` is
    the client's function that hands a request to the channel and builds the answer."""

    def __init__(
        self, check: Callable[[RateLimitRequest], RateLimitResponse], channel: Any
    ) -> None:
        self.check = check
        self._channel = channel

    @property
    def calls(self) -> int:
        """GetRateLimits calls made (checks / calls is the mean batch)."""
        return int(self._channel.coalesced_calls)
