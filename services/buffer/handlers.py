"""The buffer's request handlers: training sets and rollouts, each asked of `BufferQueries`."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated

from faststream import Context

from rollout.services.buffer.queries import BufferQueries
from rollout.shared.bus.broker import jetstream
from rollout.shared.contracts.buffer import (
    BEHIND,
    SERVICE,
    BufferData,
    DpoPairsQuery,
    GrpoGroupsQuery,
    RolloutsQuery,
    SftSetQuery,
)
from rollout.shared.contracts.requests import Reply
from rollout.shared.errors import RolloutError
from rollout.shared.service import durables
from rollout.shared.service.routes import CurrentBroker, request_route
from rollout.shared.stack.lag_probe import LagProbe
from rollout.shared.stale import stale_note

QUEUE = "buffer"
# Put in each broker's context by main.py.
Queries = Annotated[BufferQueries, Context("queries")]
# The buffer projection's lag each answer carries (`readModels`): one probe per replica, so its
# cached consumer-info read serves every query for a moment, and a slow NATS fails none.
READ_MODELS = LagProbe(durables.BUFFER)


async def _answer(asked: Awaitable[BufferData], broker: CurrentBroker) -> Reply:
    """The reply to a query: its data, and how far behind the buffer it came from is."""
    js = jetstream(broker)
    try:
        data = await asked
    except RolloutError as exc:
        # Not caught up in time: when its projection is stalled, that is why (and waiting
        # longer will not help), so the refusal says so.
        note = stale_note(await READ_MODELS.report(js)) if exc.message.startswith(BEHIND) else None
        if note is None:
            raise
        raise RolloutError(exc.message, problems=[note, *exc.problems]) from None
    data.read_models = await READ_MODELS.report(js)
    return Reply(data=data.model_dump(mode="json", by_alias=True))


async def sft_set(query: SftSetQuery, queries: Queries, broker: CurrentBroker) -> Reply:
    """Passing rollouts as chat examples with tools."""
    return await _answer(queries.sft_set(query), broker)


async def dpo_pairs(query: DpoPairsQuery, queries: Queries, broker: CurrentBroker) -> Reply:
    """Best-vs-worst preference pairs per task."""
    return await _answer(queries.dpo_pairs(query), broker)


async def grpo_groups(query: GrpoGroupsQuery, queries: Queries, broker: CurrentBroker) -> Reply:
    """Groups of completions per task with tokens, logprobs, rewards and versions."""
    return await _answer(queries.grpo_groups(query), broker)


async def rollouts(query: RolloutsQuery, queries: Queries, broker: CurrentBroker) -> Reply:
    """Scored rollouts with lineage and verdicts, selected by env, verdict, version, time."""
    return await _answer(queries.rollouts(query), broker)


ROUTES = [
    request_route(sft_set, SERVICE, "sft_set", queue=QUEUE),
    request_route(dpo_pairs, SERVICE, "dpo_pairs", queue=QUEUE),
    request_route(grpo_groups, SERVICE, "grpo_groups", queue=QUEUE),
    request_route(rollouts, SERVICE, "rollouts", queue=QUEUE),
]
