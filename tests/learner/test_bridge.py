"""The trainer's thread never waits for ever on a call its bridge will not run."""

from __future__ import annotations

import asyncio
import threading

import pytest
from waiting import wait_until

from rollout.services.learner.bridge import JobCancelled, ThreadBridge


async def test_a_call_queued_behind_a_failed_report_fails_instead_of_hanging() -> None:
    # A checkpoint upload (waited on) queued behind a progress report that failed: the drain
    # stops at the failure, so the upload never runs; its trainer used to wait on it for ever.
    bridge = ThreadBridge(asyncio.get_running_loop())
    ran: list[str] = []
    outcome: list[BaseException | None] = []

    async def failing_report() -> None:
        raise RuntimeError("the report could not be appended")

    async def checkpoint() -> None:
        ran.append("checkpoint")

    def trainer() -> None:
        try:
            bridge.call(failing_report, wait=False)
            bridge.call(checkpoint, wait=True)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001  the thread's result, checked below
            outcome.append(exc)

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    # Both queued before anything drains them: the waited call is behind the failing one.
    await wait_until(lambda: bridge.queue.qsize() == 2, "both calls queued", 10)
    with pytest.raises(RuntimeError, match="could not be appended"):
        await bridge.drain()
    await asyncio.wait_for(asyncio.to_thread(thread.join), 10)
    assert ran == [] and len(outcome) == 1 and isinstance(outcome[0], JobCancelled)

    # A call made after the bridge stopped fails at once too.
    with pytest.raises(JobCancelled):
        bridge.call(checkpoint, wait=True)
