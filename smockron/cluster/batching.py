"""Collect forwarded requests for one peer into batches (Gubernator's BATCHING).

While a call to the peer is in flight, items submitted within ``wait`` seconds of the
first one travel in one call; a batch is sent early once it holds ``limit`` items. An
item for an idle peer (no call in flight) goes without waiting, with whatever else was
submitted in the same turn of the event loop (the items of one client call): waiting
``wait`` for company that only comes under load would add it to every lone forwarded
check. Every submitter awaits its own response, and a failed call fails every item of
its batch (the caller then routes around the peer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

SendBatch = Callable[[list[In]], Awaitable[Sequence[Out]]]


class Batcher(Generic[In, Out]):
    def __init__(self, send: SendBatch[In, Out], *, wait: float, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"batch limit must be >= 1, got {limit!r}")
        self._send = send
        self._wait = wait
        self._limit = limit
        self._items: list[In] = []
        self._futures: list[asyncio.Future[Out]] = []
        self._timer: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches_sent = 0

    def __len__(self) -> int:
        """Items waiting for the next call (Gubernator's batch queue length)."""
        return len(self._items)

    def submit(self, item: In) -> asyncio.Future[Out]:
        """Queue ``item``; the future resolves to its response."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Out] = loop.create_future()
        self._items.append(item)
        self._futures.append(fut)
        if len(self._items) >= self._limit:
            self.flush()
        elif self._timer is None:
            if self._tasks:  # a call in flight: wait for company
                self._timer = loop.call_later(self._wait, self.flush)
            else:
                self._timer = loop.call_soon(self.flush)
        return fut

    def flush(self) -> None:
        """Send what is queued now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._items:
            return
        items, futures = self._items, self._futures
        self._items, self._futures = [], []
        task = asyncio.get_running_loop().create_task(self._deliver(items, futures))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, items: list[In], futures: list[asyncio.Future[Out]]) -> None:
        self.batches_sent += 1
        try:
            results = await self._send(items)
            if len(results) != len(items):
                raise RuntimeError(f"peer answered {len(results)} items for {len(items)} sent")
        except Exception as exc:  # every waiter learns why its batch failed
            for fut in futures:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for fut, result in zip(futures, results, strict=True):
            if not fut.done():
                fut.set_result(result)

    async def close(self) -> None:
        """Send what is queued and wait for batches in flight."""
        self.flush()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
