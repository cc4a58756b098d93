"""A publish JetStream refuses fails at once, not after the whole ack timeout (nats-py 2.16
left its future pending)."""

from __future__ import annotations

import asyncio
import time

import nats.js.errors
import pytest
from nats.js import api

from rollout.shared.bus import async_replies
from rollout.shared.contracts import new_id


async def test_a_refused_async_publish_fails_its_future_with_the_refusal(nats_client) -> None:
    async_replies.install()  # as importing the publisher does
    js = nats_client.jetstream()
    name = f"FULL_{new_id()[:8]}"
    await js.add_stream(
        name=name, subjects=[f"{name}.>"], max_msgs=1, discard=api.DiscardPolicy.NEW
    )
    try:
        await (await js.publish_async(f"{name}.a", b"1"))
        refused = await js.publish_async(f"{name}.b", b"2")
        started = time.monotonic()
        with pytest.raises(nats.js.errors.APIError, match="maximum messages exceeded"):
            await asyncio.wait_for(refused, 10)
        assert time.monotonic() - started < 5
    finally:
        await js.delete_stream(name)
