"""Reading the events stream from a position: replays, rebuilds, `rollout events`."""

from __future__ import annotations

from collections.abc import AsyncIterator

from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from rollout.shared import subjects


async def last_sequence(js: JetStreamContext, stream: str = subjects.EVENTS_STREAM) -> int:
    """The stream's last sequence number (0 when empty)."""
    info = await js.stream_info(stream)
    return info.state.last_seq


async def read_events(
    js: JetStreamContext,
    filter_subject: str = subjects.ALL_EVENTS,
    *,
    start_seq: int = 1,
    follow: bool = False,
    batch: int = 256,
    idle_timeout_s: float = 1.0,
    stream: str = subjects.EVENTS_STREAM,
) -> AsyncIterator[Msg]:
    """Yield stored messages in order from `start_seq`; with `follow`, keep waiting for new ones."""
    stop_at = await last_sequence(js, stream)
    if stop_at < start_seq and not follow:
        return
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start_seq,
        inactive_threshold=60.0,
        mem_storage=True,
    )
    sub = await js.pull_subscribe(filter_subject, stream=stream, config=config)
    try:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=idle_timeout_s)
            except TimeoutError:  # nats-py raises both its own and asyncio's here
                if follow:
                    continue
                return
            for msg in msgs:
                yield msg
                meta = msg.metadata
                if not follow and (meta.num_pending == 0 or meta.sequence.stream >= stop_at):
                    return
    finally:
        await sub.unsubscribe()
