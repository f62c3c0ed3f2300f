"""Coalescing concurrent checks of one process into batched GetRateLimits calls.

A gRPC call costs the client a few hundred microseconds of CPU whatever it carries, and
one item costs a few microseconds; a process making many concurrent checks (an asyncio
server, a thread pool) pays the first per call. So at most one call per client is in
flight: checks made meanwhile wait in a queue and go together, in one call, as soon as
it returns (up to 1,000 per call, the server's limit). A lone check goes at once, so a
sequential caller waits no longer than without coalescing. Gubernator's own peers batch
between nodes the same way.

Both twins deliver to each waiter its own response, or the error of the call that
carried it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from smockron.cluster.model import RateLimitRequest, RateLimitResponse

MAX_COALESCED = 1000
"""Requests in one coalesced call: the server's limit per GetRateLimits."""


class AsyncCoalescer:
    """For one event loop: ``await check(request)``; one call in flight at a time."""

    def __init__(
        self, call: Callable[[Sequence[RateLimitRequest]], Awaitable[list[RateLimitResponse]]]
    ) -> None:
        self._call = call
        self._queue: list[tuple[RateLimitRequest, asyncio.Future[RateLimitResponse]]] = []
        self._sending = False
        self.calls = 0
        """GetRateLimits calls made (checks / calls is the mean batch)."""

    async def check(self, request: RateLimitRequest) -> RateLimitResponse:
        future: asyncio.Future[RateLimitResponse] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if not self._sending:
            self._sending = True
            asyncio.get_running_loop().create_task(self._send())
        return await future

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
    done: threading.Event | None = None
    response: RateLimitResponse | None = None
    error: BaseException | None = None
    lead: bool = False
    """Woken to take over sending (its own request is still queued)."""


class Coalescer:
    """For threads: ``check(request)`` blocks. The first caller to find no call in flight
    sends, for itself and every check queued meanwhile; once its own answer is in, it
    hands the sending over to the oldest waiter, so nobody waits for others' calls."""

    def __init__(
        self, call: Callable[[Sequence[RateLimitRequest]], list[RateLimitResponse]]
    ) -> None:
        self._call = call
        self._lock = threading.Lock()
        self._queue: list[_Slot] = []
        self._sending = False
        self.calls = 0

    def check(self, request: RateLimitRequest) -> RateLimitResponse:
        slot = _Slot(request)
        with self._lock:
            self._queue.append(slot)
            lead = not self._sending
            if not lead:
                slot.done = threading.Event()
            self._sending = True
        if not lead:
            assert slot.done is not None
            slot.done.wait()
            lead = slot.lead and slot.response is None and slot.error is None
        if lead:
            self._send(slot)
        if slot.error is not None:
            raise slot.error
        assert slot.response is not None
        return slot.response

    def _send(self, mine: _Slot) -> None:
        while mine.response is None and mine.error is None:
            with self._lock:
                batch = self._queue[:MAX_COALESCED]
                del self._queue[:MAX_COALESCED]
                self.calls += 1
            try:
                responses = self._call([slot.request for slot in batch])
            except BaseException as exc:  # delivered to every waiter, the sender included
                for slot in batch:
                    slot.error = exc
                    if slot.done is not None:
                        slot.done.set()
                continue
            for slot, response in zip(batch, responses, strict=True):
                slot.response = response
                if slot.done is not None:
                    slot.done.set()
        with self._lock:
            if self._queue:  # hand over to the oldest waiter
                heir = self._queue[0]
                heir.lead = True
                assert heir.done is not None
                heir.done.set()
            else:
                self._sending = False
