"""Buffer service: keeps scored rollouts and serves SFT sets, DPO pairs and GRPO groups.

It reads the events stream in order through one durable consumer (replicas share it) and
applies run requests, generated batches and their verdicts with a ProjectionRunner: the
effect and the stream position commit together, so a redelivered event changes nothing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import asyncpg
import pydantic
from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg

from rollout.errors import RolloutError
from rollout.services.buffer.projection import DEFAULT_INLINE_BYTES, BufferProjection, wanted
from rollout.services.buffer.queries import CATCH_UP_S, BufferQueries
from rollout.services.buffer.tools import TaskTools
from rollout.shared import subjects
from rollout.shared.bus.broker import jetstream, make_broker
from rollout.shared.bus.deadletter import describe, retry_delay
from rollout.shared.bus.publisher import payload_budget
from rollout.shared.bus.streams import ensure_consumer, ensure_streams, pull_consumer_config
from rollout.shared.contracts.buffer import (
    SERVICE,
    DpoPairsQuery,
    GrpoGroupsQuery,
    RolloutsQuery,
    SftSetQuery,
)
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.requests import Reply
from rollout.shared.objectstore import ObjectStore, default_store_url, open_store
from rollout.shared.observability import get_logger
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.store.db import close_pool, create_pool, migrate
from rollout.shared.store.projection import ProjectionRunner

DURABLE = "buffer"
BATCH = 128
# A short AckWait: a delivered batch that never reached the handler (a pull request that
# expired with messages in flight) comes back in seconds, not half a minute. A batch being
# applied is kept alive with in-progress acks, so a slow one is not redelivered meanwhile.
ACK_WAIT_S = 5.0
KEEPALIVE_S = 1.5
QUEUE = "buffer"
# Trajectories whose JSON is larger than this many bytes go to the object store.
INLINE_BYTES_ENV = "ROLLOUT_BUFFER_INLINE_BYTES"

log = get_logger(__name__)


def inline_bytes_from_env(env: dict[str, str] | None = None) -> int:
    """The trajectory size threshold from ROLLOUT_BUFFER_INLINE_BYTES (default 64 KiB)."""
    env = dict(os.environ) if env is None else env
    raw = env.get(INLINE_BYTES_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_INLINE_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise RolloutError(f"{INLINE_BYTES_ENV}={raw!r} must be a whole number of bytes >= 0")
    return value


def _items(msgs: list[Msg]) -> list[tuple[EventEnvelope | None, int]]:
    """(event, position) per message; events the buffer does not read are passed over unparsed."""
    items: list[tuple[EventEnvelope | None, int]] = []
    for msg in msgs:
        event = None
        if wanted(msg.subject):
            try:
                event = EventEnvelope.from_bytes(msg.data)
            except pydantic.ValidationError as exc:
                # The tracker records the dead letter for it; the buffer only moves past it.
                log.warning(
                    "invalid event skipped", seq=msg.metadata.sequence.stream, error=describe(exc)
                )
        items.append((event, msg.metadata.sequence.stream))
    return items


@asynccontextmanager
async def _working_on_all(msgs: list[Msg]) -> AsyncIterator[None]:
    """In-progress acks for every message of a batch while the block runs."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            for msg in msgs:
                await msg.in_progress()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


def build_broker(
    settings: Settings,
    runner: ProjectionRunner,
    pool: asyncpg.Pool,
    store: ObjectStore,
    *,
    catch_up_s: float = CATCH_UP_S,
) -> NatsBroker:
    """The buffer's broker: the events consumer and the request handlers."""
    broker = make_broker(settings)
    tools = TaskTools(lambda: jetstream(broker))

    async def applied() -> int:
        """How far along the events stream the buffer has applied."""
        return await runner.position()

    queries = BufferQueries(
        pool,
        store,
        tools,
        applied,
        catch_up_s=catch_up_s,
        # No reply may exceed what the connected server accepts, whatever inline_limit says.
        reply_budget=lambda: payload_budget(jetstream(broker)),
    )

    @broker.subscriber(
        subjects.ALL_EVENTS,
        stream=JStream(subjects.EVENTS_STREAM, declare=False),
        durable=DURABLE,
        pull_sub=PullSub(batch_size=BATCH, timeout=1.0, batch=True),
        ack_policy=AckPolicy.MANUAL,
        title="buffer/ingest",
        description="Stores generated rollouts and their verdicts, in stream order, exactly once.",
    )
    async def ingest(message: NatsBatchMessage = Context("message")) -> None:  # noqa: B008
        msgs: list[Msg] = message.raw_message
        try:
            async with _working_on_all(msgs):
                settled = await runner.handle_batch(_items(msgs))
        except (asyncpg.PostgresError, OSError, RolloutError, RuntimeError) as exc:
            settled = 0
            log.warning("buffer ingest failed; retrying", error=describe(exc))
        for msg in msgs[:settled]:
            await msg.ack()
        if settled < len(msgs):
            # A gap or a failure: the rest comes back later, so no event overtakes another.
            delay = retry_delay(msgs[settled].metadata.num_delivered)
            for msg in msgs[settled:]:
                await msg.nak(delay=delay)

    @broker.subscriber(subjects.request(SERVICE, "sft_set"), queue=QUEUE, title="buffer/sft_set")
    async def sft_set(query: SftSetQuery) -> Reply:
        """Passing rollouts as chat examples with tools."""
        return Reply(data=(await queries.sft_set(query)).model_dump(mode="json"))

    @broker.subscriber(
        subjects.request(SERVICE, "dpo_pairs"), queue=QUEUE, title="buffer/dpo_pairs"
    )
    async def dpo_pairs(query: DpoPairsQuery) -> Reply:
        """Best-vs-worst preference pairs per task."""
        return Reply(data=(await queries.dpo_pairs(query)).model_dump(mode="json"))

    @broker.subscriber(
        subjects.request(SERVICE, "grpo_groups"), queue=QUEUE, title="buffer/grpo_groups"
    )
    async def grpo_groups(query: GrpoGroupsQuery) -> Reply:
        """Groups of completions per task with tokens, logprobs, rewards and versions."""
        return Reply(data=(await queries.grpo_groups(query)).model_dump(mode="json"))

    @broker.subscriber(subjects.request(SERVICE, "rollouts"), queue=QUEUE, title="buffer/rollouts")
    async def rollouts(query: RolloutsQuery) -> Reply:
        """Scored rollouts with lineage and verdicts, selected by env, verdict, version, time."""
        return Reply(data=(await queries.rollouts(query)).model_dump(mode="json"))

    return broker


async def serve(
    settings: Settings,
    *,
    inline_bytes: int | None = None,
    store: ObjectStore | None = None,
    catch_up_s: float = CATCH_UP_S,
) -> None:
    """Run one buffer replica until cancelled (`catch_up_s`: how long a query waits to catch up)."""
    if not settings.database_url:
        raise RolloutError("the buffer needs a database (ROLLOUT_DATABASE_URL or `rollout up`)")
    threshold = inline_bytes_from_env() if inline_bytes is None else inline_bytes
    store = store or open_store(default_store_url(settings.home), source=f"{settings.home}")
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await ensure_streams(js, settings.stream_replicas)
        # Unlimited deliveries: the buffer must never skip an event because Postgres was down.
        await ensure_consumer(
            js,
            subjects.EVENTS_STREAM,
            pull_consumer_config(
                DURABLE,
                subjects.ALL_EVENTS,
                ack_wait_s=ACK_WAIT_S,
                max_deliver=-1,
                max_ack_pending=BATCH * 2,
            ),
        )
    finally:
        await nc.close()
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        runner = ProjectionRunner(
            pool, BufferProjection(store, inline_bytes=threshold), contiguous=True
        )
        broker = build_broker(settings, runner, pool, store, catch_up_s=catch_up_s)
        await broker.start()
        log.info("buffer started", position=await runner.position(), inline_bytes=threshold)
        try:
            await asyncio.Event().wait()
        finally:
            await broker.stop()
    finally:
        await close_pool(pool)
