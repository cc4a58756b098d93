"""A run ends exactly once: its last rollout racing its deadline, many times, on real NATS + PG."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from nats.js.errors import NotFoundError
from pipeline.kit import refund_env
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.services.tracker import runs
from rollout.services.tracker.main import serve as serve_tracker
from rollout.shared import subjects
from rollout.shared.aggregates.run import load_run
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import EventEnvelope, new_id
from rollout.shared.contracts import events as ev
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.store.db import create_pool

RACES = 100
AT_ONCE = 10
TERMINAL = ("run.completed", "run.failed")


def requested(run_id: str, *, deadline_s: float) -> EventEnvelope:
    """A one-rollout run (task 0, n=1) that times out after `deadline_s`."""
    return EventEnvelope.new(
        ev.RunRequested(
            run_id=run_id, env_slug="race", env_version=1, env_hash="h", model="m", n=1,
            task_indices=[0], deadline_s=deadline_s,
        ),
        aggregate_id=run_id,
        id_parts=(run_id,),
        run_id=run_id,
    )  # fmt: skip


def last_rollout(parent: EventEnvelope, run_id: str) -> list[EventEnvelope]:
    """The run's only rollout, generated then scored (as an actor and the verifier would)."""
    rid = runs.rollout_id(run_id, 0, 0)
    generated = ev.RolloutsGenerated(
        run_id=run_id,
        work_item_id="w0",
        rollouts=[ev.GeneratedRollout(rollout_id=rid, task_index=0, sample_index=0, model="m")],
    )
    scored = ev.RolloutsScored(
        run_id=run_id,
        work_item_id="w0",
        rollouts=[
            ev.ScoredRollout(rollout_id=rid, task_index=0, sample_index=0, score=1.0, passed=True)
        ],
    )
    return [
        EventEnvelope.new(p, aggregate_id=run_id, id_parts=(run_id, "w0"), parent=parent)
        for p in (generated, scored)
    ]


async def status_of(pool: asyncpg.Pool, run_id: str) -> str | None:
    async with pool.acquire() as conn:
        return await conn.fetchval("select status from runs where run_id = $1", run_id)


async def terminal_events(js, run_id: str) -> list[EventEnvelope]:
    out = []
    async for msg in read_events(js, subjects.run_events(run_id)):
        event = EventEnvelope.from_bytes(msg.data)
        if event.type in TERMINAL:
            out.append(event)
    return out


@pytest.mark.slow
async def test_last_rollout_racing_the_deadline_ends_each_run_exactly_once(
    settings: Settings,
) -> None:
    tracker = asyncio.create_task(serve_tracker(settings))
    nc = await connect_nats(settings)
    js = nc.jetstream()
    pool = None
    try:

        async def tracker_ready() -> bool:
            nonlocal pool
            if tracker.done():
                tracker.result()
            try:
                pool = pool or await create_pool(settings.database_url or "")
                async with pool.acquire() as conn:
                    await conn.fetchval("select count(*) from runs")
                await js.consumer_info(subjects.EVENTS_STREAM, runs.FANOUT_DURABLE)
            except (asyncpg.UndefinedTableError, NotFoundError):
                return False  # not migrated, or its consumers not made, yet
            return True

        await wait_until(tracker_ready, "the tracker to start")
        assert pool is not None
        publisher = EventPublisher(js)

        async def race(index: int, run_id: str) -> None:
            first = requested(run_id, deadline_s=0.05)
            await publisher.publish(first)

            async def started() -> bool:
                # (Or already ended: this tracker's own watch may get there first.)
                return await status_of(pool, run_id) in ("running", "completed", "failed")

            # Fanned out (as before any verdict can exist), and already past its deadline.
            await wait_until(started, f"run {run_id} to start", limit_s=90)
            # Now overdue. Its last rollout lands while a second tracker's deadline watcher
            # decides; the tracker under test decides too, on the verdict and on its watch.
            steps = [
                publisher.publish_batch(last_rollout(first, run_id)),
                runs.fail_overdue(js, pool),
            ]
            await asyncio.gather(*(steps if index % 2 else reversed(steps)))

            async def ended() -> bool:
                return await status_of(pool, run_id) in ("completed", "failed")

            await wait_until(ended, f"run {run_id} to end", limit_s=90)

        import time

        t0 = time.monotonic()
        run_ids = [new_id()[:16] for _ in range(RACES)]
        for start in range(0, RACES, AT_ONCE):
            batch = run_ids[start : start + AT_ONCE]
            await asyncio.gather(*(race(start + i, r) for i, r in enumerate(batch)))
        print("races took", time.monotonic() - t0)
        # A straggling decision (a watcher tick, a redelivery) must find every run ended.
        assert await runs.fail_overdue(js, pool) == []

        outcomes: Counter[str] = Counter()
        for run_id in run_ids:
            ends = await terminal_events(js, run_id)
            assert len(ends) == 1, f"run {run_id} ended {[e.type for e in ends]}"
            (end,) = ends
            outcomes[end.type] += 1
            assert await status_of(pool, run_id) == end.type.removeprefix("run.")
            if end.type == "run.completed":
                assert (end.body().total, end.body().passed) == (1, 1)
            state = await load_run(js, run_id)
            assert state.ended is not None and state.decide(datetime.now(UTC)) is None
        print("checks took", time.monotonic() - t0)
        assert sum(outcomes.values()) == RACES
        print(f"races: {RACES}, outcomes: {dict(outcomes)}")
    finally:
        tracker.cancel()
        await asyncio.gather(tracker, return_exceptions=True)
        if pool is not None:
            await pool.close()
        await nc.close()


async def test_a_run_decides_its_own_ending_from_its_events(nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    run_id = new_id()[:16]
    first = requested(run_id, deadline_s=60)
    publisher = EventPublisher(js)
    await publisher.publish(first)
    await publisher.publish(
        EventEnvelope.new(
            ev.RunStarted(run_id=run_id, work_items=1, total_rollouts=1),
            aggregate_id=run_id,
            id_parts=(run_id,),
            parent=first,
        )
    )
    assert await runs.settle(js, run_id) is None  # nothing scored, deadline ahead
    failed = await runs.settle(js, run_id, now=datetime.now(UTC) + timedelta(minutes=2))
    assert isinstance(failed, ev.RunFailed)
    assert failed.reason.startswith("deadline of 60s passed with 0/1 rollouts scored")
    # Ended: a late verdict and every later decision leave it failed.
    await publisher.publish_batch(last_rollout(first, run_id))
    assert await runs.settle(js, run_id) is None
    assert [e.type for e in await terminal_events(js, run_id)] == ["run.failed"]


async def test_a_repeated_create_run_returns_the_same_run_and_fans_out_once(
    client, agent_server, settings
) -> None:
    await client.push_environment(refund_env(tasks=2))
    model = f"{agent_server.base_url}#scripted"
    request_id = new_id()
    # A retry racing the first attempt, then a late retry after it was recorded.
    first, racing = await asyncio.gather(
        client.create_run("refunds", model, n=2, client_request_id=request_id),
        client.create_run("refunds", model, n=2, client_request_id=request_id),
    )
    late = await client.create_run("refunds", model, n=2, client_request_id=request_id)
    assert first["runId"] == racing["runId"] == late["runId"]
    done = await client.wait_for_run(first["runId"], timeout_s=120)
    assert done["status"] == "completed" and done["total"] == 4
    with pytest.raises(RolloutError, match="client_request_id: .* already used"):
        await client.create_run("refunds", model, n=3, client_request_id=request_id)
    # Without an id given, the client makes a fresh one per call: two calls, two runs.
    other = await client.create_run("refunds", model, n=1)
    assert other["runId"] != first["runId"]

    nc = await connect_nats(settings)
    try:
        events = [
            EventEnvelope.from_bytes(m.data)
            async for m in read_events(nc.jetstream(), subjects.run_events(first["runId"]))
        ]
        types = Counter(e.type for e in events)
        work = await nc.jetstream().stream_info(subjects.WORK_STREAM)
    finally:
        await nc.close()
    assert (types["run.requested"], types["run.started"], types["run.completed"]) == (1, 1, 1)
    # One work item (4 rollouts, batch 16), generated once: a second fan-out would add more.
    # Each task's rollouts are published as soon as they are done: one event per task.
    generated = [
        r.rollout_id for e in events if e.type == "rollout.generated" for r in e.body().rollouts
    ]
    assert types["rollout.generated"] == 2 and work.state.messages <= 1  # the other run's
    assert len(generated) == len(set(generated)) == 4
    runs_listed = [r for r in await client.list_runs() if r["runId"] == first["runId"]]
    assert len(runs_listed) == 1
