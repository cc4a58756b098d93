"""Calls from the training thread onto the service's event loop, in order."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any


class JobCancelled(Exception):
    """The service is stopping: the training thread stops at its next report."""


class ThreadBridge:
    """The trainer runs in a worker thread; its reports become awaited coroutines on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[Callable[[], Awaitable[Any]] | None, Any]] = asyncio.Queue()
        self.cancelled = False

    def call(self, factory: Callable[[], Awaitable[Any]], *, wait: bool) -> None:
        """From the worker thread: run `factory()` on the loop (after earlier calls)."""
        if self.cancelled:
            raise JobCancelled("the learner is stopping")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(self._enqueue, factory, future)
        if wait:
            future.result()

    def _enqueue(self, factory: Callable[[], Awaitable[Any]], future: Any) -> None:
        # On the loop, like `_stop`: a call that arrives after the bridge stopped is failed
        # here, never queued where no drain would run it (its trainer would wait for ever).
        if self.cancelled:
            future.set_exception(JobCancelled("the learner is stopping"))
            return
        self.queue.put_nowait((factory, future))

    def _stop(self) -> None:
        """On the loop: no call runs any more; every one still queued fails."""
        self.cancelled = True
        while not self.queue.empty():
            _, future = self.queue.get_nowait()
            if future is not None and not future.done():
                future.set_exception(JobCancelled("the learner is stopping"))

    async def drain(self) -> None:
        """Run queued calls one by one until `close()`; the first failure stops the job."""
        while True:
            factory, future = await self.queue.get()
            if factory is None:
                return
            try:
                await factory()
            except BaseException as exc:
                future.set_exception(exc)
                self._stop()
                raise
            future.set_result(None)

    def close(self) -> None:
        """From the loop: no more calls after the queued ones."""
        self.queue.put_nowait((None, None))


async def run_in_thread(bridge: ThreadBridge, fn: Callable[[], Any]) -> Any:
    """Run `fn` in a worker thread while its reports are drained; both finish before return."""
    drainer = asyncio.create_task(bridge.drain())
    try:
        result = await asyncio.to_thread(fn)
    except BaseException:
        bridge.cancelled = True
        bridge.close()
        # A report that failed is the real reason; otherwise the trainer's own error.
        if drainer.done() and not drainer.cancelled() and drainer.exception() is not None:
            raise drainer.exception() from None  # type: ignore[misc]
        await asyncio.gather(drainer, return_exceptions=True)
        raise
    bridge.close()
    await drainer
    return result
