"""The batched, in-order projection consumer (the tracker's read models, the buffer).

Each fetch of the events stream is applied by a ProjectionRunner in one transaction: in-
progress acks keep the batch while it is applied, the settled prefix is acked after commit,
and the rest (a gap before it, or a failure) is nakked with a delay, so no event overtakes
another. What differs between projections are hooks: which subjects are parsed at all, what
an invalid event costs (a dead letter, or a warning), and what runs once a batch commits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import nats.errors
import pydantic
from faststream.nats import NatsBroker
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg

from rollout.shared.bus.broker import current_message
from rollout.shared.bus.deadletter import describe, retry_delay
from rollout.shared.bus.keepalive import working_on_all
from rollout.shared.bus.sequence import stream_sequence
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.errors import RetrySignal, RolloutError
from rollout.shared.observability import get_logger
from rollout.shared.service.consumer import Consumer
from rollout.shared.stack.health import READINESS
from rollout.shared.store.projection import UNHOLDABLE, ProjectionRunner

log = get_logger(__name__)

Items = list[tuple[EventEnvelope | None, int]]
# Failures a later attempt may not meet (Postgres or NATS away, a runner's out-of-order
# refusal): the batch is nakked with backoff, not lost.
RETRIED = (
    asyncpg.PostgresError,
    OSError,
    RuntimeError,
    RolloutError,
    RetrySignal,
    nats.errors.Error,
)
# In-progress acks this often, as a share of the consumer's AckWait.
KEEPALIVE_SHARE = 0.3


async def _skip_invalid(msg: Msg, exc: pydantic.ValidationError) -> None:
    log.warning("invalid event skipped", seq=msg.metadata.sequence.stream, error=describe(exc))


def _everything(subject: str) -> bool:
    return True


async def _undecoded(message: NatsBatchMessage) -> None:
    """Decode nothing: the projection parses each event of the fetch itself."""
    return None


def subscribe_projection(
    broker: NatsBroker,
    consumer: Consumer,
    runner: ProjectionRunner,
    *,
    wanted: Callable[[str], bool] = _everything,
    on_invalid: Callable[[Msg, pydantic.ValidationError], Awaitable[None]] = _skip_invalid,
    after_batch: Callable[[list[Msg], Items], Awaitable[None]] | None = None,
    gap_retry_s: float | None = None,
) -> None:
    """Register `consumer` (a batch consumer with manual acks) as a projection on `broker`.

    `wanted`: subjects worth parsing (others only advance the position); `on_invalid`: what an
    event that does not parse costs (it then only advances the position); `after_batch`: runs
    with the settled messages and items after the commit, before the acks (a failure retries the batch,
    which the runner then finds applied); `gap_retry_s`: the nak delay when the batch stopped
    at a gap (None: the failure backoff).
    """
    assert consumer.batch, f"{consumer.name}: a projection consumes whole fetches"
    keepalive_s = consumer.ack_wait_s * KEEPALIVE_SHARE
    # The served process's readiness (None when run outside `rollout serve`): its beats carry
    # the projection's last failure, which `rollout status` shows beside the lag.
    readiness = READINESS.get()

    async def parse(msgs: list[Msg]) -> Items:
        items: Items = []
        for msg in msgs:
            event = None
            if wanted(msg.subject):
                try:
                    event = EventEnvelope.from_bytes(msg.data)
                except pydantic.ValidationError as exc:
                    await on_invalid(msg, exc)
            items.append((event, stream_sequence(msg)))
        return items

    # No argument, and a decoder that decodes nothing: FastStream's batch decoding would
    # JSON-parse every body for nothing (parse() reads the envelopes), and a context argument
    # is resolved in a worker thread, a thread hop per fetch. The fetch is read from the
    # context directly.
    @consumer.subscriber(broker, decoder=_undecoded)
    async def project() -> None:
        msgs: list[Msg] = current_message(broker).raw_message
        failed: BaseException | None = None
        try:
            async with working_on_all(msgs, every_s=keepalive_s):
                items = await parse(msgs)
                try:
                    settled = await runner.handle_batch(items)
                except UNHOLDABLE:
                    # Retrying would fail the same way forever: find the event, skip it alone.
                    settled = await runner.handle_each(items)
                if after_batch is not None and settled:
                    await after_batch(msgs[:settled], items[:settled])
        except RETRIED as exc:
            settled, failed = 0, exc
            log.warning("projection failed; retrying", consumer=consumer.name, error=describe(exc))
            if readiness is not None:
                readiness.failing(consumer.name, describe(exc))
        except Exception as exc:
            # Not retried here (the fetch comes back after its AckWait): said all the same.
            if readiness is not None:
                readiness.failing(consumer.name, describe(exc))
            raise
        else:
            if readiness is not None:
                readiness.recovered(consumer.name)
            log.debug(
                "events projected",
                consumer=consumer.name,
                count=settled,
                last_seq=items[settled - 1][1] if settled else None,
            )
        for msg in msgs[:settled]:
            await msg.ack()
        if settled < len(msgs):
            # The rest comes back later, so no event overtakes another; a gap closes within
            # the consumer's AckWait (the earlier event is redelivered first).
            backoff = retry_delay(msgs[settled].metadata.num_delivered)
            delay = backoff if failed is not None or gap_retry_s is None else gap_retry_s
            for msg in msgs[settled:]:
                await msg.nak(delay=delay)
