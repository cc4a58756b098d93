"""A batch consumer gets a partial batch as soon as it is fetched, not after the pull timeout."""

from __future__ import annotations

import asyncio
import time

from faststream import AckPolicy, Context
from faststream.nats import JStream, PullSub
from faststream.nats.message import NatsBatchMessage
from faststream.nats.subscriber.usecases.stream_pull_subscriber import BatchPullStreamSubscriber

from rollout.shared import subjects
from rollout.shared.bus.broker import jetstream, make_broker
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.settings import connect_nats

PULL_TIMEOUT_S = 6.0


async def test_a_partial_batch_is_handled_without_waiting_out_the_pull_timeout(settings) -> None:
    """FastStream kept fetching until 128 messages or the timeout: 3 events waited 6 s."""
    broker = make_broker(settings)  # every service's broker installs the loop
    assert getattr(BatchPullStreamSubscriber._consume_pull, "_rollout_prompt_batches", False)
    got: list[list[bytes]] = []
    three = asyncio.Event()

    @broker.subscriber(
        "rollout.evt.probe.>",
        stream=JStream(subjects.EVENTS_STREAM, declare=False),
        durable="batch-probe",
        pull_sub=PullSub(batch_size=128, timeout=PULL_TIMEOUT_S, batch=True),
        ack_policy=AckPolicy.MANUAL,
    )
    async def handle(message: NatsBatchMessage = Context("message")) -> None:  # noqa: B008
        got.append([m.data for m in message.raw_message])
        for m in message.raw_message:
            await m.ack()
        if sum(map(len, got)) >= 3:
            three.set()

    nc = await connect_nats(settings)
    try:
        await ensure_streams(nc.jetstream())
    finally:
        await nc.close()
    await broker.start()
    try:
        js = jetstream(broker)
        start = time.monotonic()
        for i in range(3):
            await js.publish(f"rollout.evt.probe.x.e{i}", f"{i}".encode())
        await asyncio.wait_for(three.wait(), timeout=PULL_TIMEOUT_S * 3)
        elapsed = time.monotonic() - start
    finally:
        await broker.stop()
    assert sorted(d for batch in got for d in batch) == [b"0", b"1", b"2"]
    # Without the fix the first batch comes only when the 6 s pull timeout has run out.
    assert elapsed < PULL_TIMEOUT_S / 2, elapsed
