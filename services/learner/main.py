"""Learner service: validates training-job requests and runs jobs from the work stream.

`create_job` validates everything first (no event, no job on a bad request), then appends
`job.requested` and queues a work item. Replicas share one pull consumer and run a job at a
time with in-progress acks; a replica that dies mid-job leaves the item unacked, and the next
replica resumes from the job's last checkpoint. Every job ends with job.completed or job.failed
(attempts and dead letters: handlers.py, tuning.py, deadletters.py).
"""

from __future__ import annotations

from faststream.nats import NatsBroker

from rollout.services.learner import handlers, tuning
from rollout.services.learner.context import LearnerContext
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings


def build_broker(settings: Settings, ctx: LearnerContext | None = None) -> NatsBroker:
    """The learner's broker: the create_job route, the job consumer and the dead-letter one."""
    limits = tuning.limits()
    jobs, deadletters = tuning.consumers()
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
        assert runtime.nc is not None
        work_dir = settings.home / "learner" / "jobs"
        ctx = LearnerContext(runtime.nc, runtime.js, runtime.object_store(), work_dir)
        return build_broker(settings, ctx)

    await serve_service(
        "learner", settings, build, consumers=tuning.consumers(), keep_connection=True
    )
