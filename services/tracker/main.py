"""Tracker service: read models from every event, run lifecycle, and the queries."""

from __future__ import annotations

import asyncio
from contextlib import suppress

import asyncpg
import pydantic
from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from rollout.services.tracker import queries, runs
from rollout.services.tracker.projections import ReadModels
from rollout.shared import subjects
from rollout.shared.bus.broker import jetstream, make_broker
from rollout.shared.bus.deadletter import describe, record_dead_letter, retry_delay
from rollout.shared.bus.streams import ensure_consumer, ensure_streams, pull_consumer_config
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.observability import event_context, get_logger
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.store.db import close_pool, create_pool, migrate
from rollout.shared.store.projection import ProjectionRunner

PROJECTION_DURABLE = "tracker-read-models"
PROJECTION_BATCH = 128
DEADLINE_CHECK_S = 2.0
# Events after which a run may have just become complete.
_COMPLETION_TRIGGERS = ("rollout.scored", "run.started")

log = get_logger(__name__)


async def _project_one(
    runner: ProjectionRunner, js: JetStreamContext, pool: asyncpg.Pool, msg: Msg
) -> None:
    position = msg.metadata.sequence.stream
    try:
        event = EventEnvelope.from_bytes(msg.data)
    except pydantic.ValidationError as exc:
        await record_dead_letter(js, msg, describe(exc))
        await runner.skip(position)
        return
    with event_context(event):
        applied = await runner.handle(event, position)
        log.debug("event projected" if applied else "event already projected", seq=position)
        # Checked on redelivery too: a crash between commit and publish must not strand a run.
        if event.type in _COMPLETION_TRIGGERS and event.run_id:
            await runs.complete_if_done(js, pool, event.run_id)


def build_broker(
    settings: Settings, runner: ProjectionRunner, pool: asyncpg.Pool | None = None
) -> NatsBroker:
    """The tracker's broker with all its handlers (also used for the AsyncAPI document)."""
    broker = make_broker(settings)

    @broker.subscriber(
        subjects.ALL_EVENTS,
        stream=JStream(subjects.EVENTS_STREAM, declare=False),
        durable=PROJECTION_DURABLE,
        pull_sub=PullSub(batch_size=PROJECTION_BATCH, timeout=1.0, batch=True),
        ack_policy=AckPolicy.MANUAL,
        title="tracker/read-models",
        description="Applies every event to the Postgres read models, in stream order.",
    )
    async def project_events(message: NatsBatchMessage = Context("message")) -> None:  # noqa: B008
        # In order, one commit per event, ack right after its commit; on failure the rest of
        # the batch is retried later so no later event overtakes an earlier one.
        msgs: list[Msg] = message.raw_message
        js = jetstream(broker)
        for index, msg in enumerate(msgs):
            try:
                await _project_one(runner, js, pool, msg)
            except (asyncpg.PostgresError, OSError, RuntimeError) as exc:
                delay = retry_delay(msg.metadata.num_delivered)
                log.warning("projection failed; retrying", error=describe(exc), retry_in_s=delay)
                for pending in msgs[index:]:
                    await pending.nak(delay=delay)
                return
            await msg.ack()

    runs.register(broker)
    queries.register(broker, pool)  # type: ignore[arg-type]
    return broker


async def _watch_deadlines(js: JetStreamContext, pool: asyncpg.Pool) -> None:
    while True:
        try:
            await runs.fail_overdue(js, pool)
        except (asyncpg.PostgresError, OSError) as exc:
            log.warning("deadline check failed", error=describe(exc))
        await asyncio.sleep(DEADLINE_CHECK_S)


async def serve(settings: Settings) -> None:
    """Run the tracker until cancelled."""
    if not settings.database_url:
        raise RuntimeError("the tracker needs a database (ROLLOUT_DATABASE_URL or `rollout up`)")
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        # Unlimited deliveries: a read model must never skip an event because Postgres was down.
        await ensure_consumer(
            js,
            subjects.EVENTS_STREAM,
            pull_consumer_config(
                PROJECTION_DURABLE,
                subjects.ALL_EVENTS,
                max_deliver=-1,
                max_ack_pending=PROJECTION_BATCH * 2,
            ),
        )
        await ensure_consumer(
            js,
            subjects.EVENTS_STREAM,
            pull_consumer_config(
                runs.FANOUT_DURABLE, subjects.event_filter("run", "run.requested")
            ),
        )
    finally:
        await nc.close()
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels(), contiguous=True)
        broker = build_broker(settings, runner, pool)
        await broker.start()
        watcher = asyncio.create_task(_watch_deadlines(jetstream(broker), pool))
        log.info("tracker started", position=await runner.position())
        try:
            await asyncio.Event().wait()
        finally:
            watcher.cancel()
            with suppress(asyncio.CancelledError):
                await watcher
            await broker.stop()
    finally:
        await close_pool(pool)
