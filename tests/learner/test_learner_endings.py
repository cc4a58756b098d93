"""A job ends exactly once and is created once per client request id, on real servers."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from learner_kit import job_events, scripted_run, wait_for_event

from rollout.errors import RolloutError
from rollout.services.learner.journal import (
    JobEnded,
    JobJournal,
    end_job,
    fail_unless_finished,
)
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


async def progress_unless_ended(journal: JobJournal, step: int) -> bool:
    """Report a step; a job that ended first refuses it (JobEnded), as a cancelled one does."""
    try:
        return await journal.progress(step, RACES + 1)
    except JobEnded:
        return False


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
            progress_unless_ended(journal, index + 1),
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


@pytest.mark.slow
async def test_a_repeated_create_training_job_returns_the_same_job_and_trains_once(
    client, agent_server, tiny_model: Path
) -> None:
    run = await scripted_run(client, agent_server, n=2, tasks=2)
    base = f"hf:{tiny_model}"
    job = {
        "base_model": base, "method": "sft", "source_run_id": run["runId"], "suffix": "once",
        "hyperparams": {"max_steps": 2, "save_every": 2, "batch_size": 2},
        "client_request_id": new_id(),
    }  # fmt: skip
    first, racing = await asyncio.gather(
        client.create_training_job(**job), client.create_training_job(**job)
    )
    assert first["id"] == racing["id"] and first["model"] == racing["model"] == f"{base}:once"
    js = await client.jetstream()
    await wait_for_event(js, first["id"], "job.completed", limit_s=240)
    late = await client.create_training_job(**job)  # a retry after the job ended
    assert late["id"] == first["id"]
    with pytest.raises(RolloutError, match="client_request_id: .* already used"):
        await client.create_training_job(**{**job, "suffix": "other"})

    kinds = Counter(e.type for e in await job_events(js, first["id"]))
    assert (kinds["job.requested"], kinds["job.completed"], kinds["job.failed"]) == (1, 1, 0)
    assert kinds["checkpoint.saved"] == 1
    policies = [
        EventEnvelope.from_bytes(m.data).payload
        async for m in read_events(js, subjects.aggregate_events("policy"))
    ]
    assert [p["version"] for p in policies if p["model"] == f"{base}:once"] == [1]
    work = await js.stream_info(subjects.WORK_STREAM)
    assert work.state.messages == 0  # no second work item was queued for the retries
