"""The learner's handlers: create a job (request), run a job (work item), fail a dead-lettered one."""

from __future__ import annotations

from typing import Annotated

from faststream import Context
from faststream.nats import NatsMessage

from rollout.services.learner.context import LearnerContext
from rollout.services.learner.deadletters import fail_dead_lettered_job
from rollout.services.learner.jobs import (
    WORK_KIND,
    JobWork,
    abandoned_reason,
    cancel_job,
    create_job,
    execute,
)
from rollout.services.learner.tuning import Limits
from rollout.shared.bus.attempts import Delivery
from rollout.shared.bus.broker import jetstream
from rollout.shared.bus.deadletter import record_dead_letter
from rollout.shared.bus.keepalive import working_on
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import DeadLettered
from rollout.shared.contracts.requests import CancelTrainingJob, CreateTrainingJob, Reply
from rollout.shared.observability import get_logger
from rollout.shared.service import durables
from rollout.shared.service.routes import CurrentBroker, caller, request_route

QUEUE = "learner"

log = get_logger(__name__)


# Put in the broker's context by main.py (the context only once the service connected).
Learner = Annotated[LearnerContext, Context("learner")]
JobLimits = Annotated[Limits, Context("limits")]


async def create_job_handler(
    cmd: CreateTrainingJob, learner: Learner, broker: CurrentBroker
) -> Reply:
    """Validate and record a training job; the work happens from the work stream."""
    return Reply(data=await create_job(learner, cmd, caller(broker)))


async def cancel_job_handler(
    cmd: CancelTrainingJob, learner: Learner, broker: CurrentBroker
) -> Reply:
    """End a queued or running training job as cancelled."""
    return Reply(data=await cancel_job(learner, cmd, caller(broker)))


async def run_job(
    work: JobWork, message: NatsMessage, broker: CurrentBroker, learner: Learner, limits: JobLimits
) -> None:
    """Run a job while telling JetStream we are still on it; ack when it ended."""
    raw = message.raw_message
    delivery = Delivery.of(raw, limits.max_deliver)
    if delivery.number > delivery.limit:
        # Each earlier attempt ended without a verdict: its replica was gone. Dead-letter
        # the item; the dead-letter consumer below then fails the job with the reason.
        reason = abandoned_reason(delivery.number)
        await record_dead_letter(jetstream(broker), raw, reason)
        await raw.term()
        log.error("job abandoned", job_id=work.job_id, reason=reason)
        return
    async with working_on(raw, every_s=limits.keepalive_s):
        await execute(learner, work.job_id, delivery)


async def dead_lettered(event: EventEnvelope, broker: CurrentBroker) -> None:
    """Fail the job a dead-lettered work item belonged to (other dead letters: ignored)."""
    body = event.body()
    if isinstance(body, DeadLettered) and body.consumer == durables.LEARNER_JOBS.name:
        await fail_dead_lettered_job(jetstream(broker), body, WORK_KIND)


ROUTES = [
    request_route(
        create_job_handler, "learner", "create_job", queue=QUEUE, title="learner/create-job"
    ),
    request_route(
        cancel_job_handler, "learner", "cancel_job", queue=QUEUE, title="learner/cancel-job"
    ),
]
