"""A cancel gets in while a run's events keep landing, and a job's while its reports do.

Each decides from the aggregate's head (a few reads) and appends expecting it: deciding from
the whole history, a run with a few thousand events and one more every few milliseconds, or a
job with thousands of reports, refused every cancel with "kept changing".
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from rollout.services.learner.jobs import cancel_job
from rollout.services.tracker import runs
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import EventEnvelope, new_id
from rollout.shared.contracts import events as ev
from rollout.shared.contracts.requests import CancelRun, CancelTrainingJob
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.store.db import close_pool, create_pool, migrate

TASKS = 2000
BACKLOG = 3000


async def endings(js, aggregate: str, aggregate_id: str) -> list[EventEnvelope]:
    """Every ending on the aggregate's history."""
    out = []
    async for msg in read_events(js, subjects.aggregate_events(aggregate, aggregate_id)):
        event = EventEnvelope.from_bytes(msg.data)
        if event.type in ("run.completed", "run.failed", "job.completed", "job.failed"):
            out.append(event)
    return out


async def keep_publishing(make, stop: asyncio.Event, publisher: EventPublisher) -> int:
    """Publish `make(i)` back to back until `stop`: the aggregate never rests."""
    i = 0
    while not stop.is_set():
        await publisher.publish(make(i))
        i += 1
    return i


async def test_a_run_whose_events_keep_landing_is_still_cancelled(settings: Settings) -> None:
    nc = await connect_nats(settings)
    pool = await create_pool(settings.database_url or "")
    await migrate(pool)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        publisher = EventPublisher(js, max_in_flight=64)
        run_id = new_id()[:16]
        request = EventEnvelope.new(
            ev.RunRequested(run_id=run_id, env_slug="busy", env_version=1, env_hash="h",
                            model="m", n=1, task_indices=list(range(TASKS))),
            aggregate_id=run_id, id_parts=(run_id,), run_id=run_id,
        )  # fmt: skip
        await publisher.publish(request)

        def generated(i: int) -> EventEnvelope:
            rid = runs.rollout_id(run_id, i, 0)
            payload = ev.RolloutsGenerated(
                run_id=run_id, work_item_id=f"w{i}",
                rollouts=[ev.GeneratedRollout(rollout_id=rid, task_index=i, sample_index=0,
                                              model="m")],
            )  # fmt: skip
            return EventEnvelope.new(
                payload, aggregate_id=run_id, id_parts=(run_id, i), parent=request
            )

        await publisher.publish_batch([generated(i) for i in range(BACKLOG)])
        stop = asyncio.Event()
        busy = asyncio.create_task(
            keep_publishing(lambda i: generated(BACKLOG + i), stop, EventPublisher(js))
        )
        try:
            ended = await asyncio.wait_for(
                runs.cancel_run(js, pool, CancelRun(run_id=run_id, reason="busy")), 60
            )
        finally:
            stop.set()
            landed = await busy
        assert landed > 0  # it was busy while the cancel decided
        assert ended.reason == f"cancelled: busy (0/{TASKS} rollouts scored)"
        assert [e.type for e in await endings(js, "run", run_id)] == ["run.failed"]
    finally:
        await close_pool(pool)
        await nc.close()


async def test_a_job_whose_reports_keep_landing_is_still_cancelled(nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    publisher = EventPublisher(js, max_in_flight=64)
    job_id = f"job-{new_id()[:16]}"
    first = EventEnvelope.new(
        ev.JobRequested(job_id=job_id, method="sft", base_model="hf:x"),
        aggregate_id=job_id,
        id_parts=(job_id,),
    )
    await publisher.publish(first)

    def report(step: int) -> EventEnvelope:
        return EventEnvelope.new(
            ev.JobProgress(job_id=job_id, step=step, total_steps=10**6),
            aggregate_id=job_id,
            id_parts=(job_id, step),
            parent=first,
        )

    await publisher.publish_batch([report(step) for step in range(1, BACKLOG + 1)])
    stop = asyncio.Event()
    busy = asyncio.create_task(
        keep_publishing(lambda i: report(BACKLOG + 1 + i), stop, EventPublisher(js))
    )
    try:
        ctx = SimpleNamespace(js=js)  # what cancel_job uses of the learner's context
        ended = await asyncio.wait_for(
            cancel_job(ctx, CancelTrainingJob(job_id=job_id, reason="enough")), 60
        )
    finally:
        stop.set()
        landed = await busy
    assert landed > 0
    assert ended["reason"].startswith("cancelled: enough (at step ")
    step = int(ended["reason"].rsplit(" ", 1)[1].rstrip(")"))
    assert step >= BACKLOG  # the step it was at when the cancel got in
    assert [e.type for e in await endings(js, "job", job_id)] == ["job.failed"]
