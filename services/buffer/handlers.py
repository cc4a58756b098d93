"""The buffer's request handlers: training sets and rollouts, each asked of `BufferQueries`."""

from __future__ import annotations

from typing import Annotated

from faststream import Context

from rollout.services.buffer.queries import BufferQueries
from rollout.shared.contracts.buffer import (
    SERVICE,
    DpoPairsQuery,
    GrpoGroupsQuery,
    RolloutsQuery,
    SftSetQuery,
)
from rollout.shared.contracts.requests import Reply
from rollout.shared.service.routes import request_route

QUEUE = "buffer"
# Put in each broker's context by main.py.
Queries = Annotated[BufferQueries, Context("queries")]


async def sft_set(query: SftSetQuery, queries: Queries) -> Reply:
    """Passing rollouts as chat examples with tools."""
    return Reply(data=(await queries.sft_set(query)).model_dump(mode="json"))


async def dpo_pairs(query: DpoPairsQuery, queries: Queries) -> Reply:
    """Best-vs-worst preference pairs per task."""
    return Reply(data=(await queries.dpo_pairs(query)).model_dump(mode="json"))


async def grpo_groups(query: GrpoGroupsQuery, queries: Queries) -> Reply:
    """Groups of completions per task with tokens, logprobs, rewards and versions."""
    return Reply(data=(await queries.grpo_groups(query)).model_dump(mode="json"))


async def rollouts(query: RolloutsQuery, queries: Queries) -> Reply:
    """Scored rollouts with lineage and verdicts, selected by env, verdict, version, time."""
    return Reply(data=(await queries.rollouts(query)).model_dump(mode="json"))


ROUTES = [
    request_route(sft_set, SERVICE, "sft_set", queue=QUEUE),
    request_route(dpo_pairs, SERVICE, "dpo_pairs", queue=QUEUE),
    request_route(grpo_groups, SERVICE, "grpo_groups", queue=QUEUE),
    request_route(rollouts, SERVICE, "rollouts", queue=QUEUE),
]
