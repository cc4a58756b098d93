"""Wait on a condition with a deadline: the one poll loop of the tests (never a bare sleep)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
# How long to wait between two looks: short, since what is awaited is on this machine.
INTERVAL_S = 0.05


async def wait_until(
    condition: Callable[[], T | Awaitable[T]],
    what: str,
    limit_s: float = 60.0,
    *,
    interval_s: float = INTERVAL_S,
) -> T:
    """Ask `condition` (sync or async) until it returns something truthy; return that.

    AssertionError naming `what` once `limit_s` has passed without it.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {limit_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval_s)


def wait_until_sync(
    condition: Callable[[], T], what: str, limit_s: float = 60.0, *, interval_s: float = INTERVAL_S
) -> T:
    """`wait_until` for code without an event loop (a subprocess, a file appearing)."""
    deadline = time.monotonic() + limit_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


async def ticks_during(work: Awaitable[T], every_s: float = 0.01) -> tuple[T, int, float]:
    """(work's result, how often a ticker got the event loop meanwhile, the seconds it took):
    about took / every_s ticks when the loop stayed free, none when work held it."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(every_s)  # the ticker's cadence, not a wait for anything
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        result = await work
    finally:
        took = time.monotonic() - started
        ticker.cancel()
    return result, ticks, took
