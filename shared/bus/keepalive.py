"""In-progress acks while a handler works longer than the consumer's AckWait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress

from nats.aio.msg import Msg


@asynccontextmanager
async def working_on_all(msgs: list[Msg], *, every_s: float) -> AsyncIterator[None]:
    """Send `+WPI` for every message every `every_s` seconds until the block exits."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every_s)  # the beat's period, not a wait for a condition
            for msg in msgs:
                await msg.in_progress()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


def working_on(msg: Msg, *, every_s: float) -> AbstractAsyncContextManager[None]:
    """Send `+WPI` every `every_s` seconds until the block exits, so JetStream waits for us."""
    return working_on_all([msg], every_s=every_s)
