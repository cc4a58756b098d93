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

from faststream.nats import NatsBroker

from rollout.services.learner import handlers
from rollout.services.learner.context import LearnerContext
from rollout.services.learner.jobs import MAX_DELIVER
from rollout.shared.observability import get_logger
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.consumer import Consumer
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings, env_number

DURABLE = durables.LEARNER_JOBS.name
DEADLETTER_DURABLE = durables.LEARNER_DEADLETTERS.name
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


def consumers() -> list[Consumer]:
    """The job consumer (with this replica's AckWait) and the dead-lettered jobs' follower."""
    return [durables.LEARNER_JOBS.tuned(ack_wait_s=ack_wait_s()), durables.LEARNER_DEADLETTERS]


def build_broker(settings: Settings, ctx: LearnerContext | None = None) -> NatsBroker:
    """The learner's broker: the create_job route, the job consumer and the dead-letter one."""
    limits = handlers.Limits(max_deliver(), keepalive_s=ack_wait_s() / 3)
    jobs, deadletters = consumers()
    return service_broker(
        settings,
        handlers.ROUTES,
        consumers=[(jobs, handlers.run_job), (deadletters, handlers.dead_lettered)],
        max_deliver=limits.max_deliver,
        learner=ctx,
        limits=limits,
    )


async def serve(settings: Settings) -> None:
    """Run one learner replica until cancelled."""

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        store = runtime.object_store()
        assert runtime.nc is not None
        ctx = LearnerContext(
            nc=runtime.nc, js=runtime.js, store=store, work_dir=settings.home / "learner" / "jobs"
        )
        log.info("learner started", work_dir=str(ctx.work_dir))
        return build_broker(settings, ctx)

    await serve_service("learner", settings, build, consumers=consumers(), keep_connection=True)
