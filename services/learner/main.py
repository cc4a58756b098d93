"""Learner service: validates training-job requests and runs jobs from the work stream.

`rollout.req.learner.create_job` validates everything first (no event, no job on a bad
request), then appends `job.requested` and queues a work item. One pull consumer shared by the
replicas runs jobs one at a time per replica, with in-progress acks while it trains; a replica
that dies mid-job leaves the item unacked, so another (or the restarted one) gets it again and
resumes from the job's last checkpoint in the object store.
"""

from __future__ import annotations

import asyncio
import os

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from nats.js import api
from pydantic import BaseModel, ConfigDict

from rollout.errors import RolloutError
from rollout.services.learner.bridge import JobCancelled
from rollout.services.learner.context import LearnerContext
from rollout.services.learner.journal import JobJournal, job_history
from rollout.services.learner.local_jobs import model_name
from rollout.services.learner.planning import plan_job, request_of
from rollout.shared import subjects
from rollout.shared.bus.broker import make_broker
from rollout.shared.bus.deadletter import describe
from rollout.shared.bus.keepalive import working_on
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.streams import ensure_consumer, ensure_streams, pull_consumer_config
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.requests import CreateTrainingJob, Reply
from rollout.shared.objectstore import open_store
from rollout.shared.objectstore.factory import default_store_url
from rollout.shared.observability import get_logger
from rollout.shared.settings import Settings, connect_nats

DURABLE = "learner"
QUEUE = "learner"
WORK_KIND = "jobs"
MAX_DELIVER = 3
# Long jobs send in-progress acks; a dead learner's job comes back after AckWait.
ACK_WAIT_ENV = "ROLLOUT_LEARNER_ACK_WAIT_S"

log = get_logger(__name__)


def ack_wait_s() -> float:
    """How long a job may go without an in-progress ack before it is redelivered."""
    raw = os.environ.get(ACK_WAIT_ENV, "").strip()
    try:
        value = float(raw) if raw else 60.0
    except ValueError:
        raise RolloutError(f"{ACK_WAIT_ENV} must be a number of seconds, got {raw!r}") from None
    return max(1.0, value)


class JobWork(BaseModel):
    """A work item: run this job (everything else is on the log)."""

    model_config = ConfigDict(extra="forbid")

    job_id: str


async def create_job(ctx: LearnerContext, cmd: CreateTrainingJob) -> dict:
    """Validate, append job.requested, queue the work item; the reply names the job."""
    plan = await plan_job(ctx.js, ctx.store, cmd)
    job_id = plan.event.job_id
    event = EventEnvelope.new(plan.event, aggregate_id=job_id, id_parts=(job_id,))
    # A brand-new job id has no history: expecting sequence 0 guards against collisions.
    await EventPublisher(ctx.js).publish(event, expected_last_subject_seq=0)
    await ctx.js.publish(
        subjects.work(WORK_KIND, job_id),
        JobWork(job_id=job_id).model_dump_json().encode(),
        headers={api.Header.MSG_ID: job_id},
    )
    model = model_name(plan)
    log.info("job requested", job_id=job_id, method=cmd.method, base=cmd.base_model, model=model)
    return {
        "id": job_id,
        "jobId": job_id,
        "status": "queued",
        "method": plan.event.method,
        "baseModel": plan.event.base_model,
        "model": model,
        "sourceRunId": plan.event.source_run_id,
        "envSlug": plan.event.env_slug,
        "trainingRows": len(plan.rollouts or []),
        "pairs": plan.pairs,
    }


async def execute(ctx: LearnerContext, job_id: str, *, deliveries: int) -> None:
    """Run (or resume) one job; user-facing problems end it as job.failed with the reason."""
    from rollout.services.learner.local_jobs import run_local_job
    from rollout.services.learner.online_grpo import run_grpo_job
    from rollout.services.learner.providers import run_provider_job

    history = await job_history(ctx.js, job_id)
    if history.requested is None:
        log.warning("work item for an unknown job; dropped", job_id=job_id)
        return
    if history.finished:
        return  # redelivered after it ended: nothing to redo
    journal = JobJournal(ctx.js, job_id, history.envelope)
    try:
        plan = await plan_job(ctx.js, ctx.store, request_of(history.requested), job_id=job_id)
        if not plan.base.local:
            await run_provider_job(ctx, plan, history)
        elif plan.event.method == "grpo":
            await run_grpo_job(ctx, plan, history)
        else:
            await run_local_job(ctx, plan, history)
    except RolloutError as exc:
        log.warning("job failed", job_id=job_id, reason=str(exc))
        await journal.failed(str(exc))
    except (JobCancelled, asyncio.CancelledError):
        raise  # the learner is stopping: the job comes back to a replica later
    except Exception as exc:
        if deliveries >= MAX_DELIVER:
            reason = f"gave up after {deliveries} attempts: {describe(exc)}"
            log.error("job failed", job_id=job_id, reason=reason)
            await journal.failed(reason)
            return
        raise  # retried with backoff by the broker's dead-letter policy


def build_broker(settings: Settings, ctx: LearnerContext | None = None) -> NatsBroker:
    """The learner's broker: the create_job request handler and the job consumer."""
    broker = make_broker(settings, max_deliver=MAX_DELIVER)
    every_s = ack_wait_s() / 3

    def context() -> LearnerContext:
        assert ctx is not None, "the learner context is set in serve()"
        return ctx

    @broker.subscriber(
        subjects.request("learner", "create_job"), queue=QUEUE, title="learner/create-job"
    )
    async def create_job_handler(cmd: CreateTrainingJob) -> Reply:
        """Validate and record a training job; the work happens from the work stream."""
        return Reply(data=await create_job(context(), cmd))

    @broker.subscriber(
        subjects.work_filter(WORK_KIND),
        stream=JStream(subjects.WORK_STREAM, declare=False),
        durable=DURABLE,
        pull_sub=PullSub(batch_size=1, timeout=1.0),
        ack_policy=AckPolicy.NACK_ON_ERROR,
        title="learner/run-job",
        description="Runs one training job to its end (resuming from its last checkpoint).",
    )
    async def run_job(work: JobWork, message: NatsMessage) -> None:
        """Run a job while telling JetStream we are still on it; ack when it ended."""
        raw = message.raw_message
        async with working_on(raw, every_s=every_s):
            await execute(context(), work.job_id, deliveries=raw.metadata.num_delivered)

    return broker


async def serve(settings: Settings) -> None:
    """Run one learner replica until cancelled."""
    nc = await connect_nats(settings, name="learner")
    store = open_store(default_store_url(settings.home), source="ROLLOUT_OBJECT_STORE_URL")
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        await ensure_consumer(
            js,
            subjects.WORK_STREAM,
            pull_consumer_config(
                DURABLE,
                subjects.work_filter(WORK_KIND),
                ack_wait_s=ack_wait_s(),
                max_deliver=MAX_DELIVER,
                max_ack_pending=64,
            ),
        )
        ctx = LearnerContext(nc=nc, js=js, store=store, work_dir=settings.home / "learner" / "jobs")
        broker = build_broker(settings, ctx)
        await broker.start()
        log.info("learner started", work_dir=str(ctx.work_dir))
        try:
            await asyncio.Event().wait()
        finally:
            await broker.stop()
    finally:
        await store.close()
        await nc.close()
