"""A job ends exactly once: job.completed and job.failed racing, on a real nats-server."""

from __future__ import annotations

import asyncio

from rollout.services.learner.journal import JobJournal, end_job, fail_unless_finished
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import EventEnvelope, new_id
from rollout.shared.contracts.events import JobCompleted, JobProgress, JobRequested

RACES = 60


async def endings(js, job_id: str) -> list[str]:
    """The types of every ending the job's history holds."""
    out = []
    async for msg in read_events(js, subjects.aggregate_events("job", job_id)):
        event = EventEnvelope.from_bytes(msg.data)
        if event.type in ("job.completed", "job.failed"):
            out.append(event.type)
    return out


async def test_completion_racing_a_dead_letter_failure_ends_each_job_once(nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    publisher = EventPublisher(js)

    async def race(index: int) -> tuple[str, list[bool]]:
        job_id = new_id()[:20]
        first = EventEnvelope.new(
            JobRequested(job_id=job_id, method="sft", base_model="hf:x"),
            aggregate_id=job_id,
            id_parts=(job_id,),
        )
        await publisher.publish(first)
        journal = JobJournal(js, job_id, first)
        steps = [
            journal.completed("ft:model", None, {"loss": 0.5}),
            fail_unless_finished(js, job_id, "work item dead-lettered"),
            # A progress report landing meanwhile makes the conditional appends look again.
            journal.progress(index + 1, RACES + 1),
        ]
        order = [0, 1, 2] if index % 2 else [2, 1, 0]
        done = await asyncio.gather(*(steps[i] for i in order))
        results = dict(zip(order, done, strict=True))
        return job_id, [results[0], results[1]]  # did completed / failed append?

    outcomes = await asyncio.gather(*(race(i) for i in range(RACES)))
    kinds = []
    for job_id, _ in outcomes:
        ends = await endings(js, job_id)
        assert len(ends) == 1, f"job {job_id} ended {ends}"
        kinds.extend(ends)
    # Exactly one of the two callers was told its ending was the one appended, the right one.
    for (job_id, (completed, failed)), kind in zip(outcomes, kinds, strict=True):
        assert [completed, failed] == [kind == "job.completed", kind == "job.failed"], job_id
    print(f"job races: {RACES}, outcomes: {kinds.count('job.completed')} completed")


async def test_an_ended_job_keeps_its_ending(nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    job_id = new_id()[:20]
    first = EventEnvelope.new(
        JobRequested(job_id=job_id, method="sft", base_model="hf:x"),
        aggregate_id=job_id,
        id_parts=(job_id,),
    )
    await EventPublisher(js).publish(first)
    await EventPublisher(js).publish(
        EventEnvelope.new(
            JobProgress(job_id=job_id, step=1, total_steps=2), aggregate_id=job_id, id_parts=(1,)
        )
    )
    assert await end_job(js, JobCompleted(job_id=job_id, model_id="ft:m"))
    assert not await fail_unless_finished(js, job_id, "too late")
    assert not await JobJournal(js, job_id, first).completed("ft:other", None, {})
    assert not await end_job(js, JobCompleted(job_id=new_id()[:20], model_id="ft:m"))  # unknown
    assert await endings(js, job_id) == ["job.completed"]
