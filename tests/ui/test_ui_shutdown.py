"""The viewer stops when asked: its follower of the events stream ends on cancel, and a part
that does not stop cannot hold the shutdown."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from ui_kit import serve

from rollout.services.ui import app as ui_app
from rollout.services.ui.live import EventHub
from rollout.shared.settings import Settings, connect_nats

# Far past what a cancelled follower needs (its next loop turn), even on a loaded machine.
STOP_S = 20.0


async def test_a_cancelled_follower_stops_even_when_a_request_swallowed_the_cancel(
    nats_settings: Settings,
) -> None:
    # No events stream (as before `rollout up`): the follower asks for it again and again.
    # Python 3.11's wait_for returns a reply that lands with a cancel and drops the cancel;
    # the follower took the reply's "no stream" for one more retry and never ended, so the
    # viewer's shutdown waited on it for ever (a UI test hung until pytest's timeout).
    nc = await connect_nats(nats_settings)
    try:
        hub = EventHub(nc.jetstream(), pool=None)  # type: ignore[arg-type]  # no reads of it
        rng = random.Random(11)
        for attempt in range(40):
            # No pause between tries: a cancel meets a request in flight within a few tries.
            follower = asyncio.create_task(hub.follow(retry_s=0.0))
            await asyncio.sleep(rng.uniform(0.0, 0.01))
            follower.cancel()
            done, _ = await asyncio.wait({follower}, timeout=STOP_S)
            if not done:
                follower.cancel()  # once more: the failure below leaves nothing running
            assert done, f"cancel {attempt} did not stop the follower"
            assert follower.cancelled()
    finally:
        await nc.close()


async def test_the_viewer_stops_even_when_its_follower_does_not(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever the reason a follower ignores its cancel, the shutdown goes on without it.
    released = asyncio.Event()

    async def stubborn(self: EventHub, retry_s: float = 1.0) -> None:
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                pass  # as a request that swallowed the cancel would

    monkeypatch.setattr(EventHub, "follow", stubborn)
    monkeypatch.setattr(ui_app, "SHUTDOWN_WAIT_S", 1.0)
    try:
        async with serve(settings) as ui:
            assert ui.url
            started = time.monotonic()
        took = time.monotonic() - started
        assert took < STOP_S, f"the viewer took {took:.0f} s to stop"
    finally:
        released.set()
