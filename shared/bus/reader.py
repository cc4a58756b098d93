"""Reading the events stream from a position: replays, rebuilds, `rollout events`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from rollout.shared import subjects

# A one-off read fetches without pause; its consumer is inactive only once the read is over.
ONE_OFF_INACTIVE_S = 10.0
# How long a one-off read waits for messages its consumer already sent before it gives up.
LATE_DELIVERY_LIMIT_S = 30.0


async def last_sequence(js: JetStreamContext, stream: str = subjects.EVENTS_STREAM) -> int:
    """The stream's last sequence number (0 when empty)."""
    info = await js.stream_info(stream)
    return info.state.last_seq


async def read_events(
    js: JetStreamContext,
    filter_subject: str | list[str] = subjects.ALL_EVENTS,
    *,
    start_seq: int = 1,
    follow: bool = False,
    batch: int = 256,
    idle_timeout_s: float = 1.0,
    stream: str = subjects.EVENTS_STREAM,
    delete_consumer: bool = False,
) -> AsyncIterator[Msg]:
    """Yield stored messages in order from `start_seq`; with `follow`, keep waiting for new ones.

    `filter_subject` may be a list of filters (one aggregate's chosen event types, say).
    With `delete_consumer` the read's consumer is deleted at the end, and expires soon if the
    delete is lost (services loading an aggregate per decision would otherwise pile them up).
    Service users may delete their reads' consumers, never a durable
    (rollout.shared.auth.services); API keys may not, so their readers leave it to the server's
    inactive threshold.
    """
    stop_at = await last_sequence(js, stream)
    if stop_at < start_seq and not follow:
        return
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start_seq,
        inactive_threshold=ONE_OFF_INACTIVE_S if delete_consumer else 60.0,
        mem_storage=True,
    )
    what = ", ".join(filter_subject) if isinstance(filter_subject, list) else filter_subject
    if isinstance(filter_subject, list):
        config.filter_subjects = list(filter_subject)
        filter_subject = subjects.ALL_EVENTS
    sub = await js.pull_subscribe(filter_subject, stream=stream, config=config)
    seen = 0  # messages yielded: the consumer's delivery count once all have arrived
    late_since: float | None = None  # waiting since then for messages already delivered
    try:
        if not follow and (await _left_to_read(sub)) == (0, 0):
            # Nothing matches (an aggregate with no events yet): said now, not after a fetch
            # that waits out its idle timeout.
            return
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=idle_timeout_s)
            except TimeoutError:  # nats-py raises both its own and asyncio's here
                if follow:
                    continue
                pending, delivered = await _left_to_read(sub)
                if pending:
                    continue
                if delivered <= seen:
                    return
                late_since = late_since or time.monotonic()
                if time.monotonic() - late_since >= LATE_DELIVERY_LIMIT_S:
                    # A short read would pass for a whole one (a job's history without its
                    # ending): an error instead.
                    raise ConnectionError(
                        f"reading {what}: {delivered} messages were delivered but only "
                        f"{seen} arrived within {LATE_DELIVERY_LIMIT_S:.0f} s"
                    ) from None
                continue
            late_since = None
            for msg in msgs:
                yield msg
                meta = msg.metadata
                seen += 1
                if not follow and (meta.num_pending == 0 or meta.sequence.stream >= stop_at):
                    return
    finally:
        await _close(js, sub, stream, config.name if delete_consumer else None)


async def _close(
    js: JetStreamContext, sub: JetStreamContext.PullSubscription, stream: str, name: str | None
) -> None:
    """End a read: its subscription, and its consumer when the reader deletes its own."""
    await sub.unsubscribe()
    if name:
        await js.delete_consumer(stream, name)


async def _left_to_read(sub: JetStreamContext.PullSubscription) -> tuple[int, int]:
    """(messages not yet delivered, messages delivered) of a read's consumer.

    A fetch times out on a loaded machine before the server answers; only the consumer can
    say whether nothing matched or the answer is late (a history read short is a wrong one).
    """
    info = await sub.consumer_info()
    return info.num_pending or 0, info.delivered.consumer_seq if info.delivered else 0
