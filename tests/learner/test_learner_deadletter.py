"""Every way a job's work item is dead-lettered ends the job with job.failed and the reason."""

from __future__ import annotations

import json
from pathlib import Path

import nats.errors
import pytest
from faststream.nats import JStream, PullSub
from learner_kit import (
    Platform,
    job_events,
    kill,
    ready_client,
    refund_env,
    shut_down,
    start_learner,
    wait_for_event,
)
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.services.actor.main import build_broker as actor_broker
from rollout.services.learner import jobs as learner_jobs
from rollout.shared import subjects
from rollout.shared.bus.broker import make_broker
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import (
    ensure_consumer,
    ensure_stream,
    ensure_streams,
    pull_consumer_config,
    work_stream_config,
)
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import (
    DeadLettered,
    JobCompleted,
    JobRequested,
    PolicyUpdated,
)
from rollout.shared.service import durables
from rollout.shared.settings import connect_nats

pytestmark = pytest.mark.slow


async def dead_letters(js) -> list[DeadLettered]:
    """Every dead letter recorded so far."""
    found = []
    async for msg in read_events(js, subjects.aggregate_events("deadletter")):
        body = EventEnvelope.from_bytes(msg.data).body()
        assert isinstance(body, DeadLettered)
        found.append(body)
    return found


async def append(js, payload, aggregate_id: str, *parts: object) -> None:
    """Append one event as its service would."""
    await EventPublisher(js).publish(
        EventEnvelope.new(payload, aggregate_id=aggregate_id, id_parts=parts)
    )


def requested(job_id: str) -> JobRequested:
    """A job.requested for an SFT job (nothing runs it unless a work item is queued)."""
    return JobRequested(job_id=job_id, method="sft", base_model="hf:/nowhere", source_run_id="r")


def letter(job_id: str, seq: int, reason: str = "broken") -> DeadLettered:
    """A dead letter for job `job_id`'s work item at work-stream position `seq`."""
    return DeadLettered(
        consumer=durables.LEARNER_JOBS.name,
        stream=subjects.WORK_STREAM,
        stream_seq=seq,
        subject=subjects.work(learner_jobs.WORK_KIND, job_id),
        deliveries=1,
        reason=reason,
    )


async def wait_consumer_idle(js, stream: str, durable: str) -> None:
    """Wait until a durable consumer has handled (acked) everything it was given."""

    async def idle() -> bool:
        info = await js.consumer_info(stream, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0

    await wait_until(idle, f"consumer {durable} to catch up", limit_s=30)


async def test_undecodable_work_item_fails_its_job_once_and_never_a_finished_one(
    learner_env,
) -> None:
    platform = Platform(learner_env)
    platform.start("learner")
    nc = await connect_nats(learner_env)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        await append(js, requested("job-poison"), "job-poison", "job-poison")
        await append(js, requested("job-done"), "job-done", "job-done")
        await append(js, requested("job-forged"), "job-forged", "job-forged")
        done = JobCompleted(job_id="job-done", model_id="m")
        await append(js, done, "job-done", "job-done", "completed")

        # A work item whose payload cannot be decoded: the broker dead-letters it at once.
        await js.publish(subjects.work(learner_jobs.WORK_KIND, "job-poison"), b"{not json")
        failed = await wait_for_event(js, "job-poison", "job.failed", limit_s=60)
        reason = failed.payload["reason"]
        assert reason.startswith("the job's work item was dead-lettered after 1 delivery: ")
        assert "invalid payload" in reason or "JSONDecodeError" in reason, reason
        [recorded] = await dead_letters(js)
        assert recorded.subject == subjects.work(learner_jobs.WORK_KIND, "job-poison")
        # Recorded under the job consumer's own name, which only the learner may publish to.
        [subject] = [m.subject async for m in read_events(js, subjects.dead_letter())]
        assert subject == subjects.dead_letter(durables.LEARNER_JOBS.name)

        # A job item's dead letter recorded under another service's consumer (what an actor's
        # credential may publish): the learner does not act on it.
        await append(js, letter("job-forged", 9_999), "actors", "forged")
        # A second dead letter for the same job, and one for a job that already completed.
        await append(js, letter("job-poison", 10_000), durables.LEARNER_JOBS.name, "again")
        await append(js, letter("job-done", 10_001), durables.LEARNER_JOBS.name, "done")
        await wait_consumer_idle(js, subjects.EVENTS_STREAM, durables.LEARNER_DEADLETTERS.name)
        platform.check()
        assert [e.type for e in await job_events(js, "job-poison")].count("job.failed") == 1
        assert "job.failed" not in [e.type for e in await job_events(js, "job-done")]
        assert "job.failed" not in [e.type for e in await job_events(js, "job-forged")]
    finally:
        await nc.close()
        await platform.stop("learner")


async def test_job_whose_learner_is_killed_on_every_attempt_ends_failed(
    learner_env, tiny_model: Path, tmp_path: Path
) -> None:
    # No actor: the GRPO job starts, saves version 0 and waits for its first run, mid-job.
    platform = Platform(learner_env)
    for name in ("env-registry", "tracker"):
        platform.start(name)
    log = tmp_path / "learner.log"
    limits = {"ROLLOUT_LEARNER_ACK_WAIT_S": "2", "ROLLOUT_LEARNER_MAX_DELIVER": "1"}
    learner = start_learner(learner_env, log, **limits)
    client = await ready_client(learner_env, platform.check)
    try:
        await client.push_environment(refund_env(tasks=3))
        job = await client.create_training_job(
            base_model=f"hf:{tiny_model}", method="grpo", env_slug="refunds",
            hyperparams={"max_steps": 2, "group_size": 2, "max_tokens": 8},
        )  # fmt: skip
        js = await client.jetstream()
        await wait_for_event(js, job["id"], "checkpoint.saved", limit_s=120)
        await kill(learner)

        # The one attempt allowed ended with its replica gone: the next delivery gives up.
        learner = start_learner(learner_env, log, **limits)
        failed = await wait_for_event(js, job["id"], "job.failed", limit_s=120)
        await wait_until(
            lambda: _status_is(client, job["id"], "failed"), "the tracker to show the failure"
        )
        letters = [x for x in await dead_letters(js) if x.consumer == durables.LEARNER_JOBS.name]
        kinds = [e.type for e in await job_events(js, job["id"])]
    finally:
        await shut_down(learner, client, platform)

    reason = failed.payload["reason"]
    assert "dead-lettered after 2 deliveries" in reason, reason
    assert "gave up after 1 attempt: the learner replica running the job stopped" in reason
    assert [x.deliveries for x in letters] == [2], log.read_text()[-3000:]
    assert kinds.count("job.failed") == 1 and "job.completed" not in kinds


async def _status_is(client, job_id: str, status: str) -> bool:
    try:
        job = await client.get_training_job(job_id)
    except RolloutError as exc:
        if "no training job" in str(exc):
            return False  # the tracker's read model has not seen the job yet
        raise
    return job["status"] == status


async def reply_to(nc, event: EventEnvelope) -> bytes | None:
    """What a core request with `event` gets back: None when subscribed but nobody answers."""

    async def ask() -> tuple[bytes | None] | None:
        try:
            msg = await nc.request(event.subject, event.to_bytes(), timeout=1.0)
        except nats.errors.NoRespondersError:
            return None  # the broker's subscription has not reached the server yet: ask again
        except nats.errors.TimeoutError:
            return (None,)  # subscribed, and nobody answered
        return (msg.data,)

    (answer,) = await wait_until(ask, "a subscriber of the subject", 30)
    return answer


def failing_policy_broker(settings):
    """A broker whose policy.updated handler always raises (a replica that cannot load)."""
    broker = make_broker(settings)

    @broker.subscriber(subjects.event_filter("policy", "policy.updated"), no_reply=True)
    async def broken(event: EventEnvelope) -> None:
        raise RuntimeError("this replica cannot load the policy")

    return broker


async def test_core_subscribers_of_policy_updates_never_answer_the_publisher(
    nats_settings, nats_client
) -> None:
    # Actors follow policy.updated as core subscribers. The learner appends it with a
    # JetStream publish, which waits on its reply subject for the stream's ack: an answer
    # from a subscriber (empty, or an error) that got there first once failed a GRPO job
    # with "JSONDecodeError: Expecting value" right after its version 0. With no stream to
    # answer here, any reply at all would come from a subscriber.
    await ensure_stream(nats_client.jetstream(), work_stream_config())  # the actor's work
    payload = PolicyUpdated(model="m", version=0, checkpoint_uri="file:///c", sha256="0" * 64)
    event = EventEnvelope.new(payload, aggregate_id="m", id_parts=("m", 0))
    for broker in (actor_broker(nats_settings), failing_policy_broker(nats_settings)):
        await broker.start()
        try:
            assert await reply_to(nats_client, event) is None
        finally:
            await broker.stop()


async def test_a_decoding_error_inside_the_handler_is_retried_not_dead_lettered(
    nats_settings,
) -> None:
    nc = await connect_nats(nats_settings)
    js = nc.jetstream()
    await ensure_streams(js)
    config = pull_consumer_config("decode-test", subjects.work_filter("decode"), max_deliver=3)
    await ensure_consumer(js, subjects.WORK_STREAM, config)
    broker = make_broker(nats_settings, max_deliver=3)
    seen: list[int] = []

    @broker.subscriber(
        subjects.work_filter("decode"),
        stream=JStream(subjects.WORK_STREAM, declare=False),
        durable="decode-test",
        pull_sub=PullSub(batch_size=1, timeout=0.5),
    )
    async def handler(body: dict) -> None:
        seen.append(body["n"])
        if len(seen) == 1:
            json.loads("")  # e.g. an empty reply: the message itself is fine

    await broker.start()
    try:
        await js.publish(subjects.work("decode", "one"), json.dumps({"n": 1}).encode())
        await wait_until(_length_is(seen, 2), "the retry")
        await wait_consumer_idle(js, subjects.WORK_STREAM, "decode-test")
        assert seen == [1, 1]
        assert await dead_letters(js) == []
    finally:
        await broker.stop()
        await nc.close()


def _length_is(items: list, n: int):
    async def check() -> bool:
        return len(items) >= n

    return check
