"""Cancels a request swallowed: Python 3.11's `asyncio.wait_for` returns the reply (and drops
the cancel) when the reply lands in the same loop iteration as the cancel.

nats-py's requests wait with `wait_for`, so a task cancelled while it waits for the server may
go on as if nothing happened. A loop that retries or follows forever (a lease's standby, the
viewer's follower of the events stream, a followed read) then never ends, and whatever awaits
it after cancelling it waits forever. The cancel is still counted on the task
(`Task.cancelling()`): such loops ask here after each request and stop.
"""

from __future__ import annotations

import asyncio


def cancelling() -> bool:
    """True when this task was asked to stop (even if a request swallowed the cancel)."""
    task = asyncio.current_task()
    return task is not None and bool(task.cancelling())


def raise_if_cancelled() -> None:
    """Raise CancelledError when this task was asked to stop and a request swallowed it."""
    if cancelling():
        raise asyncio.CancelledError
