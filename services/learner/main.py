"""Learner service: validates training-job requests and runs jobs from the work stream.

`rollout.req.learner.create_job` validates everything first (no event, no job on a bad
request), then appends `job.requested` and queues a work item. One pull consumer shared by the
replicas runs jobs one at a time per replica, with in-progress acks while it trains; a replica
that dies mid-job leaves the item unacked, so another (or the restarted one) gets it again and
resumes from the job's last checkpoint in the object store.

Every job ends with job.completed or job.failed. JetStream itself never stops redelivering a
job (the consumer's MaxDeliver is unlimited): the learner counts the deliveries. A failing
attempt is retried until the last of `ROLLOUT_LEARNER_MAX_DELIVER` attempts, which fails the
job; an item delivered once more than that had its last attempt end with the replica gone
(killed, out of memory), so it is dead-lettered with that reason. Every dead-lettered job
item the job consumer recorded then ends its job with job.failed (see deadletters.py).
"""

from __future__ import annotations

import asyncio

from faststream.nats import NatsBroker, NatsMessage
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict

from rollout.services.learner.bridge import JobCancelled
from rollout.services.learner.context import LearnerContext
from rollout.services.learner.deadletters import fail_dead_lettered_job
from rollout.services.learner.journal import JobJournal, job_history
from rollout.services.learner.local_jobs import model_name, run_local_job
from rollout.services.learner.online_jobs import run_online_job
from rollout.services.learner.planning import plan_job, request_of
from rollout.services.learner.providers import run_provider_job
from rollout.services.learner.training_sets import BufferUnavailable
from rollout.shared import subjects
from rollout.shared.bus.broker import jetstream, make_broker
from rollout.shared.bus.deadletter import describe, record_dead_letter
from rollout.shared.bus.keepalive import working_on
from rollout.shared.bus.publisher import ConcurrencyConflict, EventPublisher
from rollout.shared.contracts.envelope import EventEnvelope, deterministic_id
from rollout.shared.contracts.events import DeadLettered, JobRequested
from rollout.shared.contracts.requests import CreateTrainingJob, Reply, request_fingerprint
from rollout.shared.errors import RolloutError
from rollout.shared.models.trained import JOB_PREFIX, new_job_id
from rollout.shared.objectstore import open_store
from rollout.shared.objectstore.factory import default_store_url
from rollout.shared.observability import get_logger
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.consumer import Consumer
from rollout.shared.settings import Settings, env_number

DURABLE = durables.LEARNER_JOBS.name
DEADLETTER_DURABLE = durables.LEARNER_DEADLETTERS.name
QUEUE = "learner"
WORK_KIND = "jobs"
# Attempts per job: a failing attempt is retried with backoff, a replica that died mid-job
# hands the job to the next one; after this many the job fails.
MAX_DELIVER = 3
MAX_DELIVER_ENV = "ROLLOUT_LEARNER_MAX_DELIVER"
# Long jobs send in-progress acks; a dead learner's job comes back after AckWait.
ACK_WAIT_ENV = "ROLLOUT_LEARNER_ACK_WAIT_S"

log = get_logger(__name__)


def ack_wait_s() -> float:
    """How long a job may go without an in-progress ack before it is redelivered."""
    return max(1.0, env_number(ACK_WAIT_ENV, 60.0, unit="seconds"))


def max_deliver() -> int:
    """How many attempts a job gets before it fails (`ROLLOUT_LEARNER_MAX_DELIVER`, default 3)."""
    return int(env_number(MAX_DELIVER_ENV, MAX_DELIVER, whole=True, low=1))


def gave_up(attempts: int, why: str) -> str:
    """The reason a job fails after its attempts: how many, and what the last one met."""
    return f"gave up after {attempts} attempt{'s' if attempts != 1 else ''}: {why}"


def abandoned_reason(deliveries: int) -> str:
    """Why a job whose last delivery ended with the replica gone is given up."""
    return gave_up(
        deliveries - 1,
        "the learner replica running the job stopped before the job ended "
        "(killed, out of memory, or restarted)",
    )


class JobWork(BaseModel):
    """A work item: run this job (everything else is on the log)."""

    model_config = ConfigDict(extra="forbid")

    job_id: str


def job_id_for(cmd: CreateTrainingJob) -> str:
    """The job's id: derived from the client request id (so a retry names the same job)."""
    if cmd.client_request_id is None:
        return new_job_id()
    return f"{JOB_PREFIX}{deterministic_id('job-request', cmd.client_request_id)[:16]}"


async def recorded_job(js: JetStreamContext, job_id: str) -> JobRequested | None:
    """The job.requested already on the log for `job_id`, or None."""
    name = subjects.event_name(JobRequested.event_type)
    try:
        raw = await js.get_last_msg(subjects.EVENTS_STREAM, subjects.event("job", job_id, name))
    except NotFoundError:
        return None
    body = EventEnvelope.from_bytes(raw.data).body()
    assert isinstance(body, JobRequested)
    return body


def _check_same(recorded: JobRequested, cmd: CreateTrainingJob) -> None:
    if recorded.request_hash != request_fingerprint(cmd):
        raise RolloutError(
            f"client_request_id: {cmd.client_request_id!r} was already used for another "
            f"training job (job {recorded.job_id}); send a fresh id with each new command"
        )


async def _queue(ctx: LearnerContext, job_id: str) -> None:
    """Queue the job's work item (its id is the job's: JetStream drops a repeat in its window)."""
    await ctx.js.publish(
        subjects.work(WORK_KIND, job_id),
        JobWork(job_id=job_id).model_dump_json().encode(),
        headers={api.Header.MSG_ID: job_id},
    )


async def _requeue_if_lost(ctx: LearnerContext, job_id: str) -> None:
    """A retry after a first attempt that recorded the job but died before queueing it."""
    history = await job_history(ctx.js, job_id)
    if history.finished or history.last_step > 0 or history.checkpoints:
        return  # it ended, or a replica has it
    try:
        await ctx.js.get_last_msg(subjects.WORK_STREAM, subjects.work(WORK_KIND, job_id))
    except NotFoundError:
        # Work-queue retention: no item means none was queued (items leave only once the job
        # ended, which the history above would show).
        await _queue(ctx, job_id)
        log.warning("job had no work item; queued it again", job_id=job_id)


async def create_job(ctx: LearnerContext, cmd: CreateTrainingJob) -> dict:
    """Validate, append job.requested, queue the work item; the reply names the job.

    Once per client request id: the append expects the job's history to be empty, so a retry
    (or a racing duplicate) reads the recorded job back and gets the same reply.
    """
    job_id = job_id_for(cmd)
    plan = await plan_job(ctx, cmd, job_id=job_id)
    requested = plan.event.model_copy(
        update={"request_id": cmd.client_request_id, "request_hash": request_fingerprint(cmd)}
    )
    event = EventEnvelope.new(requested, aggregate_id=job_id, id_parts=(job_id,))
    try:
        result = await EventPublisher(ctx.js).publish(event, expected_last_subject_seq=0)
    except ConcurrencyConflict:
        result = None
    if result is None or result.duplicate:
        recorded = await recorded_job(ctx.js, job_id)
        if recorded is None:
            raise RolloutError(f"job {job_id} could not be recorded; retry the request")
        _check_same(recorded, cmd)
        await _requeue_if_lost(ctx, job_id)
        log.info("job request repeated; same job", job_id=job_id)
    else:
        await _queue(ctx, job_id)
        log.info("job requested", job_id=job_id, method=cmd.method, base=cmd.base_model)
    return {
        "id": job_id,
        "jobId": job_id,
        "status": "queued",
        "method": plan.event.method,
        "baseModel": plan.event.base_model,
        "model": model_name(plan),
        "sourceRunId": plan.event.source_run_id,
        "sourceDataset": (
            plan.event.source_dataset.sha256 if plan.event.source_dataset is not None else None
        ),
        "envSlug": plan.event.env_slug,
        "trainingRows": len(plan.rows or []),
        "pairs": plan.pairs,
    }


async def execute(
    ctx: LearnerContext, job_id: str, *, deliveries: int, limit: int = MAX_DELIVER
) -> None:
    """Run (or resume) one job; user-facing problems end it as job.failed with the reason."""
    history = await job_history(ctx.js, job_id)
    if history.requested is None:
        log.warning("work item for an unknown job; dropped", job_id=job_id)
        return
    if history.finished:
        return  # redelivered after it ended: nothing to redo
    journal = JobJournal(ctx.js, job_id, history.envelope)
    try:
        plan = await plan_job(ctx, request_of(history.requested), job_id=job_id)
        if not plan.base.local:
            await run_provider_job(ctx, plan, history)
        elif plan.method.online:
            await run_online_job(ctx, plan, history)
        else:
            await run_local_job(ctx, plan, history)
    except BufferUnavailable as exc:
        # Most likely a buffer restarting: retried with backoff, from the last checkpoint.
        if not await _failed_on_last_attempt(journal, deliveries, limit, str(exc)):
            raise
    except RolloutError as exc:
        log.warning("job failed", job_id=job_id, reason=str(exc))
        await journal.failed(str(exc))
    except (JobCancelled, asyncio.CancelledError):
        raise  # the learner is stopping: the job comes back to a replica later
    except Exception as exc:
        if not await _failed_on_last_attempt(journal, deliveries, limit, describe(exc)):
            raise  # retried with backoff by the broker's dead-letter policy


async def _failed_on_last_attempt(
    journal: JobJournal, deliveries: int, limit: int, what: str
) -> bool:
    """On the last allowed attempt, end the job with job.failed (True); else leave it (False)."""
    if deliveries < limit:
        return False
    reason = gave_up(deliveries, what)
    log.error("job failed", job_id=journal.job_id, reason=reason)
    await journal.failed(reason)
    return True


def build_broker(settings: Settings, ctx: LearnerContext | None = None) -> NatsBroker:
    """The learner's broker: the create_job request handler and the job consumer."""
    limit = max_deliver()
    broker = make_broker(settings, max_deliver=limit)
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

    @durables.LEARNER_JOBS.subscriber(broker)
    async def run_job(work: JobWork, message: NatsMessage) -> None:
        """Run a job while telling JetStream we are still on it; ack when it ended."""
        raw = message.raw_message
        deliveries = raw.metadata.num_delivered
        if deliveries > limit:
            # Each earlier attempt ended without a verdict: its replica was gone. Dead-letter
            # the item; the dead-letter consumer below then fails the job with the reason.
            reason = abandoned_reason(deliveries)
            await record_dead_letter(jetstream(broker), raw, reason)
            await raw.term()
            log.error("job abandoned", job_id=work.job_id, reason=reason)
            return
        async with working_on(raw, every_s=every_s):
            await execute(context(), work.job_id, deliveries=deliveries, limit=limit)

    @durables.LEARNER_DEADLETTERS.subscriber(broker)
    async def dead_lettered(event: EventEnvelope) -> None:
        """Fail the job a dead-lettered work item belonged to (other dead letters: ignored)."""
        body = event.body()
        if isinstance(body, DeadLettered) and body.consumer == DURABLE:
            await fail_dead_lettered_job(jetstream(broker), body, WORK_KIND)

    return broker


def consumers() -> list[Consumer]:
    """The job consumer (with this replica's AckWait) and the dead-lettered jobs' follower."""
    return [durables.LEARNER_JOBS.tuned(ack_wait_s=ack_wait_s()), durables.LEARNER_DEADLETTERS]


async def serve(settings: Settings) -> None:
    """Run one learner replica until cancelled."""

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        store = open_store(default_store_url(settings.home), source="ROLLOUT_OBJECT_STORE_URL")
        runtime.on_stop(store.close)
        assert runtime.nc is not None
        ctx = LearnerContext(
            nc=runtime.nc, js=runtime.js, store=store, work_dir=settings.home / "learner" / "jobs"
        )
        log.info("learner started", work_dir=str(ctx.work_dir))
        return build_broker(settings, ctx)

    await serve_service("learner", settings, build, consumers=consumers(), keep_connection=True)
