"""Helpers for buffer tests: the platform plus the buffer, queries, and synthetic run events."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from pipeline.kit import Platform
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.buffer import main as buffer_main
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import last_sequence
from rollout.shared.bus.requests import call
from rollout.shared.contracts import events as ev
from rollout.shared.contracts.buffer import BufferData, BufferQuery
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.objectstore import ObjectStore
from rollout.shared.settings import Settings, connect_nats


class BufferPlatform(Platform):
    """Platform services as tasks, plus the buffer with a chosen store and threshold."""

    def __init__(self, settings: Settings, store: ObjectStore) -> None:
        super().__init__(settings)
        self.store = store

    def start_buffer(
        self, *, inline_bytes: int = 64 * 1024, key: str = "buffer", catch_up_s: float = 10.0
    ) -> None:
        """Start one buffer replica."""
        serve = buffer_main.serve(
            self.settings, inline_bytes=inline_bytes, store=self.store, catch_up_s=catch_up_s
        )
        self.tasks[key] = asyncio.create_task(serve, name=key)


async def push_env(settings: Settings, platform: Platform, env: dict[str, Any]) -> None:
    """Push an environment once the registry answers."""
    client = AsyncClient(settings, timeout_s=20)

    async def pushed() -> bool:
        try:
            await client.push_environment(env)
        except RolloutError:
            platform.check()
            return False
        return True

    try:
        await wait_until(pushed, "the registry to take the environment", 30)
    finally:
        await client.close()


async def ask(settings: Settings, verb: str, query: BufferQuery) -> BufferData:
    """One buffer request; RolloutError with the buffer's reasons on failure."""
    nc = await connect_nats(settings)
    try:
        data = await call(nc, subjects.request("buffer", verb), query, timeout_s=20)
    finally:
        await nc.close()
    return BufferData.model_validate(data)


async def wait_caught_up(settings: Settings, platform: Platform, limit_s: float = 60) -> None:
    """Wait until the buffer's durable consumer has nothing pending or unacked."""
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()

        seen: list[Any] = [None]

        async def caught_up() -> bool:
            platform.check()
            try:
                info = await js.consumer_info(subjects.EVENTS_STREAM, buffer_main.DURABLE)
            except NotFoundError:  # the buffer has not created it yet
                return False
            seen[0] = info
            return info.num_pending == 0 and info.num_ack_pending == 0

        try:
            await wait_until(caught_up, "the buffer to catch up with the events stream", limit_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last consumer state: {seen[0]}") from None
    finally:
        await nc.close()


async def wait_for_position(pool: asyncpg.Pool, js: JetStreamContext, limit_s: float = 60) -> None:
    """Wait until the buffer has applied every event now on the stream."""
    target = await last_sequence(js)

    async def applied() -> bool:
        async with pool.acquire() as conn:
            position = await conn.fetchval(
                "select position from projection_tracking where name = 'buffer'"
            )
        return (position or 0) >= target

    await wait_until(applied, f"the buffer to apply events up to {target}", limit_s)


async def scored_count(pool: asyncpg.Pool, run_id: str) -> int:
    """How many scored rollouts of `run_id` the buffer holds."""
    async with pool.acquire() as conn:
        return await conn.fetchval(
            "select count(*) from buffer_rollouts where run_id = $1 and scored_at is not null",
            run_id,
        )


async def buffer_rows(pool: asyncpg.Pool) -> list[tuple]:
    """Every buffer row, in a stable order."""
    async with pool.acquire() as conn:
        rows = await conn.fetch("select * from buffer_rollouts order by rollout_id")
    return [tuple(r.values()) for r in rows]


def _trajectory(
    order: str, amount: int, *, version: int, tokens: bool, final: str = "refunded"
) -> dict[str, Any]:
    """A refund conversation: prompt, one tool call, the tool's answer, a final text."""
    call_id = f"call-{order}-{amount}"
    trajectory: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": f"Refund order {order} in full"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "refund",
                            "arguments": f'{{"order_id": "{order}", "amount": {amount}}}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "name": "refund", "content": "ok"},
            {"role": "assistant", "content": final},
        ],
        "tool_calls": [
            {"index": 0, "name": "refund", "arguments": {"order_id": order, "amount": amount}}
        ],
        "final_output": final,
    }
    if tokens:
        trajectory["token_ids"] = [[1, version, amount], [2, 3]]
        trajectory["logprobs"] = [[-0.5, -0.25, -0.125], [-1.0, -2.0]]
    return trajectory


async def publish_run(
    js: JetStreamContext,
    run_id: str,
    env: dict[str, Any],
    scores: dict[int, list[float]],
    *,
    policy_version: int = 0,
    tokens: bool = True,
    final: str = "refunded",
    error: str | None = None,
) -> None:
    """Append a run's events as the services would: requested, generated, scored per task.

    `scores[task]` lists each sample's score; a score of 1.0 passes.
    """
    from rollout.shared.store import env_versions

    registered, _ = await env_versions.latest(js, env["slug"])
    assert registered is not None, "push the environment first"
    publisher = EventPublisher(js)
    requested = ev.RunRequested(
        run_id=run_id,
        env_slug=registered.slug,
        env_version=registered.version,
        env_hash=registered.spec_hash,
        model="scripted",
        n=max(len(s) for s in scores.values()),
        policy_version=policy_version,
        task_indices=sorted(scores),
    )
    await publisher.publish(
        EventEnvelope.new(requested, aggregate_id=run_id, id_parts=(run_id,), run_id=run_id)
    )
    for task, task_scores in sorted(scores.items()):
        work_id = f"{run_id}-{task}"
        generated = [
            ev.GeneratedRollout(
                rollout_id=f"{run_id}-{task}-{i}",
                task_index=task,
                sample_index=i,
                trajectory=_trajectory(
                    f"O-{task}", 10 * task + i, version=policy_version, tokens=tokens, final=final
                ),
                model="scripted",
                policy_version=policy_version,
                seed=i,
            )
            for i in range(len(task_scores))
        ]
        scored = [
            ev.ScoredRollout(
                rollout_id=g.rollout_id,
                task_index=task,
                sample_index=g.sample_index,
                score=score,
                passed=score >= 1.0,
                error=error,
            )
            for g, score in zip(generated, task_scores, strict=True)
        ]
        for payload in (
            ev.RolloutsGenerated(run_id=run_id, work_item_id=work_id, rollouts=generated),
            ev.RolloutsScored(run_id=run_id, work_item_id=work_id, rollouts=scored),
        ):
            await publisher.publish(
                EventEnvelope.new(payload, aggregate_id=run_id, id_parts=(work_id,), run_id=run_id)
            )
