"""Dead-lettered job work items end their jobs: `deadletter.recorded` -> `job.failed`.

A job's work item can be dead-lettered without the job handler ever saying so: the broker's
dead-letter policy terminates a payload that cannot be decoded, and the learner gives up on
an item whose earlier deliveries all ended with the replica gone (SIGKILL, out of memory).
Both record `deadletter.recorded` under the job consumer's name; the learner follows those
events (that consumer's only: `subjects.dead_letter(DURABLE)`, which no other service's
credential may publish to) with a durable consumer and fails the job they name. Reacting to the event (rather than hooking the middleware)
covers every path that records a dead letter, including ones recorded while no learner was
up, and a learner that dies between the dead letter and job.failed does it on redelivery.
"""

from __future__ import annotations

from nats.js import JetStreamContext

from rollout.services.learner.journal import fail_unless_finished
from rollout.shared import subjects
from rollout.shared.contracts.events import DeadLettered
from rollout.shared.observability import get_logger

log = get_logger(__name__)


def work_prefix(kind: str) -> str:
    """The subject prefix of one work kind's items (`rollout.work.<kind>.`)."""
    return subjects.work_filter(kind).removesuffix(">")


def job_of(letter: DeadLettered, kind: str) -> str | None:
    """The job id a dead letter is about, or None when it is not a job work item."""
    prefix = work_prefix(kind)
    if letter.stream != subjects.WORK_STREAM or not letter.subject.startswith(prefix):
        return None
    job_id = letter.subject[len(prefix) :]
    try:
        return subjects.token(job_id, "job id")
    except subjects.SubjectError:
        return None


def failure_reason(letter: DeadLettered) -> str:
    """What job.failed says: the item was dead-lettered, after how many deliveries, and why."""
    times = "delivery" if letter.deliveries == 1 else "deliveries"
    return (
        f"the job's work item was dead-lettered after {letter.deliveries} {times}: {letter.reason}"
    )


async def fail_dead_lettered_job(js: JetStreamContext, letter: DeadLettered, kind: str) -> bool:
    """Append job.failed for the job a dead letter names (once; never after it ended)."""
    job_id = job_of(letter, kind)
    if job_id is None:
        return False
    appended = await fail_unless_finished(js, job_id, failure_reason(letter))
    if appended:
        log.error("job failed: work item dead-lettered", job_id=job_id, reason=letter.reason)
    return appended
