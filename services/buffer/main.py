"""Buffer service: keeps scored rollouts and serves SFT sets, DPO pairs and GRPO groups.

It reads the events stream in order through one durable consumer (replicas share it) and
applies run requests, generated batches and their verdicts with a ProjectionRunner: the
effect and the stream position commit together, so a redelivered event changes nothing.
"""

from __future__ import annotations

import asyncpg
from faststream.nats import NatsBroker

from rollout.services.buffer.projection import DEFAULT_INLINE_BYTES, BufferProjection, wanted
from rollout.services.buffer.queries import CATCH_UP_S, BufferQueries
from rollout.services.buffer.tools import TaskTools
from rollout.shared import subjects
from rollout.shared.bus.broker import jetstream, make_broker
from rollout.shared.bus.publisher import payload_budget
from rollout.shared.contracts.buffer import (
    SERVICE,
    DpoPairsQuery,
    GrpoGroupsQuery,
    RolloutsQuery,
    SftSetQuery,
)
from rollout.shared.contracts.requests import Reply
from rollout.shared.objectstore import ObjectStore, default_store_url, open_store
from rollout.shared.observability import get_logger
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.projection_consumer import subscribe_projection
from rollout.shared.settings import Settings, env_number
from rollout.shared.store.projection import ProjectionRunner

DURABLE = durables.BUFFER.name
QUEUE = "buffer"
# Trajectories whose JSON is larger than this many bytes go to the object store.
INLINE_BYTES_ENV = "ROLLOUT_BUFFER_INLINE_BYTES"

log = get_logger(__name__)


def inline_bytes_from_env(env: dict[str, str] | None = None) -> int:
    """The trajectory size threshold from ROLLOUT_BUFFER_INLINE_BYTES (default 64 KiB)."""
    return int(env_number(INLINE_BYTES_ENV, DEFAULT_INLINE_BYTES, whole=True, unit="bytes",
                          low=0, env=env))  # fmt: skip


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

    # The tracker records the dead letter of an invalid event; the buffer only moves past it.
    subscribe_projection(broker, durables.BUFFER, runner, wanted=wanted)

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
    threshold = inline_bytes_from_env() if inline_bytes is None else inline_bytes
    store = store or open_store(default_store_url(settings.home), source=f"{settings.home}")

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        pool = runtime.database()
        runner = ProjectionRunner(
            pool, BufferProjection(store, inline_bytes=threshold), contiguous=True
        )
        log.info("buffer started", position=await runner.position(), inline_bytes=threshold)
        return build_broker(settings, runner, pool, store, catch_up_s=catch_up_s)

    await serve_service("buffer", settings, build, consumers=[durables.BUFFER], database=True)
