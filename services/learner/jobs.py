"""Training jobs: recorded once per client request, queued, then run (or resumed) to an end.

`create_job` validates everything first (no event, no job on a bad request), then appends
`job.requested` expecting an empty history and queues a work item; `execute` runs one
delivery of a job and ends it with job.failed on a user-facing problem or its last attempt.
"""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict

from rollout.services.learner.artifacts import check_name_owner
from rollout.services.learner.bridge import JobCancelled
from rollout.services.learner.context import LearnerContext
from rollout.services.learner.journal import (
    JobEnded,
    JobHistory,
    JobJournal,
    job_head,
    job_history,
)
from rollout.services.learner.local_jobs import model_name, run_local_job
from rollout.services.learner.online_jobs import run_online_job
from rollout.services.learner.planning import plan_job, request_of
from rollout.services.learner.providers import cancel_left_behind, run_provider_job
from rollout.services.learner.training_sets import BufferUnavailable
from rollout.shared import subjects
from rollout.shared.aggregates import quota
from rollout.shared.aggregates.append import append_unless, decide_and_append
from rollout.shared.auth.ownership import check_may_change
from rollout.shared.bus.attempts import Delivery, gave_up
from rollout.shared.bus.deadletter import describe
from rollout.shared.bus.publisher import ConcurrencyConflict, EventPublisher
from rollout.shared.contracts.envelope import EventEnvelope, deterministic_id
from rollout.shared.contracts.events import JobCompleted, JobFailed, JobRequested
from rollout.shared.contracts.requests import (
    CancelTrainingJob,
    CreateTrainingJob,
    owned_request_key,
    request_fingerprint,
)
from rollout.shared.errors import RolloutError
from rollout.shared.models.trained import JOB_PREFIX, new_job_id
from rollout.shared.observability import get_logger

WORK_KIND = "jobs"
# Attempts per job: a failing attempt is retried with backoff, a replica that died mid-job
# hands the job to the next one; after this many the job fails.
MAX_DELIVER = 3
# Tries of a cancel: another is needed only when the job completed meanwhile.
CANCEL_RETRIES = 3

log = get_logger(__name__)


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


def job_id_for(cmd: CreateTrainingJob, owner: str | None = None) -> str:
    """The job's id: derived from its owner's client request id (a retry names the same job)."""
    if cmd.client_request_id is None:
        return new_job_id()
    key = owned_request_key(owner, cmd.client_request_id)
    return f"{JOB_PREFIX}{deterministic_id('job-request', *key)[:16]}"


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


async def create_job(
    ctx: LearnerContext, cmd: CreateTrainingJob, caller: str = subjects.ANONYMOUS
) -> dict:
    """Validate, append job.requested, queue the work item; the reply names the job.

    Once per client request id: the append expects the job's history to be empty, so a retry
    (or a racing duplicate) reads the recorded job back and gets the same reply. The job
    belongs to `caller` (the request's subject names it); its id derives from the caller's
    request id, so another user's same request id names another job.
    """
    job_id = job_id_for(cmd, caller)
    plan = await plan_job(ctx, cmd, job_id=job_id)
    await check_name_owner(ctx.store, ctx.js, model_name(plan), job_id, caller)
    requested = plan.event.model_copy(
        update={
            "request_id": cmd.client_request_id,
            "request_hash": request_fingerprint(cmd),
            "owner": caller,
        }
    )
    if await recorded_job(ctx.js, job_id) is None:
        # Charged before it is recorded, once per job id; a key past its budget of jobs a day
        # is refused here (shared/aggregates/quota.py). A retry of a recorded job pays nothing.
        await quota.charge(ctx.js, caller, "jobs", 1, job_id)
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
        # The source run's tasks of other splits, left out of the training data.
        "heldOutTasksExcluded": plan.held_out_excluded,
        "pairs": plan.pairs,
    }


async def execute(ctx: LearnerContext, job_id: str, delivery: Delivery | None = None) -> None:
    """Run (or resume) one job; user-facing problems end it as job.failed with the reason."""
    delivery = delivery or Delivery(1, MAX_DELIVER)
    history = await job_history(ctx.js, job_id)
    if history.requested is None:
        log.warning("work item for an unknown job; dropped", job_id=job_id)
        return
    if history.finished:
        # Redelivered after it ended: nothing to redo, but a provider's job cancelled
        # meanwhile is stopped there too.
        await cancel_left_behind(ctx, history)
        return
    journal = JobJournal(ctx.js, job_id, history.envelope)
    # Loading the base and the data, or an online job's first round, takes minutes before
    # the first step: without this the job read `queued` all that while.
    await journal.started(delivery.number)
    try:
        requested = history.requested
        plan = await plan_job(
            ctx, request_of(requested), job_id=job_id, env_version=requested.env_version
        )
        if not plan.base.local:
            await run_provider_job(ctx, plan, history)
        elif plan.method.online:
            await run_online_job(ctx, plan, history)
        else:
            await run_local_job(ctx, plan, history)
    except BufferUnavailable as exc:
        # Most likely a buffer restarting: retried with backoff, from the last checkpoint.
        if not await _failed_on_last_attempt(journal, delivery, str(exc)):
            raise
    except RolloutError as exc:
        log.warning("job failed", job_id=job_id, reason=str(exc))
        await journal.failed(str(exc))
    except JobEnded as exc:
        # Cancelled while it ran: its ending is on the log already; the work item is done.
        log.info("job stopped: it ended while running", job_id=job_id, detail=str(exc))
    except (JobCancelled, asyncio.CancelledError):
        raise  # the learner is stopping: the job comes back to a replica later
    except Exception as exc:
        if not await _failed_on_last_attempt(journal, delivery, describe(exc)):
            raise  # retried with backoff by the broker's dead-letter policy


async def cancel_job(
    ctx: LearnerContext, cmd: CancelTrainingJob, caller: str = subjects.ANONYMOUS
) -> dict:
    """End a queued or running job as cancelled; its worker stops at its next step.

    Decided from the job's head (its request, last step and endings) and appended on the
    condition that the job has no completion: the one decision it could race with. Not on the
    whole job, whose reports keep landing while it trains; its id is the job's one `job.failed`
    id, so a failure appended meanwhile makes the cancel a duplicate JetStream drops, told as
    such. A job that completes while the cancel is on its way keeps its completion.
    """
    subjects.token(cmd.job_id, "job id")
    why = f": {cmd.reason.strip()}" if cmd.reason and cmd.reason.strip() else ""
    completion = subjects.event("job", cmd.job_id, subjects.event_name(JobCompleted.event_type))

    def decide(head: JobHistory) -> JobFailed | None:
        if head.requested is None or head.finished:
            return None
        check_may_change(caller, head.requested.owner, f"job {cmd.job_id}")
        return JobFailed(job_id=cmd.job_id, reason=f"cancelled{why} (at step {head.last_step})")

    async def append_cancel(head: JobHistory, ending: JobFailed) -> None:
        envelope = EventEnvelope.new(
            ending, aggregate_id=cmd.job_id, id_parts=(cmd.job_id,), parent=head.envelope
        )
        await append_unless(ctx.js, envelope, completion)

    head, ending = await decide_and_append(
        lambda: job_head(ctx.js, cmd.job_id), decide, append_cancel,
        what=f"job {cmd.job_id}", retries=CANCEL_RETRIES,
    )  # fmt: skip
    if ending is not None:
        log.warning("job cancelled", job_id=cmd.job_id, reason=ending.reason)
        return {"jobId": cmd.job_id, "status": "failed", "reason": ending.reason}
    if head.requested is None:
        raise RolloutError(f"job_id: no training job {cmd.job_id!r} (see `rollout jobs`)")
    if head.completed is not None:
        raise RolloutError(
            f"job {cmd.job_id} already completed ({head.completed.model_id}): nothing to cancel"
        )
    failed = head.failed.reason if head.failed is not None else "unknown"
    raise RolloutError(f"job {cmd.job_id} already failed ({failed}): nothing to cancel")


async def _failed_on_last_attempt(journal: JobJournal, delivery: Delivery, what: str) -> bool:
    """On the last allowed attempt, end the job with job.failed (True); else leave it (False)."""
    if not delivery.last:
        return False
    reason = delivery.gave_up(what)
    log.error("job failed", job_id=journal.job_id, reason=reason)
    await journal.failed(reason)
    return True
