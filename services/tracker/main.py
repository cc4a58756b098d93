"""Tracker service: read models from every event, run lifecycle, and the queries.

Every replica answers the requests (handlers.py): run creation appends `run.requested`
expecting an empty history (a retry or a racing replica reads the recorded run back), a plan
event expects the plan's version the caller saw, and queries only read Postgres. So requests
are safe anywhere, spread over the replicas by the queue group, and keep being answered while
leadership moves. The projection, the fan-out and the deadlines are the leader's (leader.py).
"""

from __future__ import annotations

import asyncpg
from faststream.nats import NatsBroker

from rollout.services.tracker import handlers, runs
from rollout.services.tracker.leader import (
    LEADER_CONSUMERS,
    lead_when_elected,
    register_leader_handlers,
)
from rollout.services.tracker.servable import check_timeout_s
from rollout.shared.objectstore import ObjectStore
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings
from rollout.shared.store.projection import ProjectionRunner

PROJECTION_DURABLE = durables.TRACKER_READ_MODELS.name


def build_broker(settings: Settings, runner: ProjectionRunner | None = None) -> NatsBroker:
    """Every handler of the tracker on one broker (what the AsyncAPI document describes)."""
    broker = service_broker(settings, handlers.ROUTES)
    register_leader_handlers(broker, runner)  # type: ignore[arg-type]
    return broker


def request_broker(settings: Settings, pool: asyncpg.Pool, store: ObjectStore) -> NatsBroker:
    """The requests every replica answers."""
    return service_broker(settings, handlers.ROUTES, pool=pool, store=store)


async def serve(settings: Settings) -> None:
    """Run one tracker replica until cancelled: it answers requests, and leads when elected."""
    check_timeout_s()  # a bad ROLLOUT_MODEL_CHECK_S stops the replica before it connects
    runs.run_window()  # so does a bad ROLLOUT_RUN_WINDOW

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        return request_broker(settings, runtime.database(), runtime.object_store())

    async def run(runtime: ServiceRuntime) -> None:
        await lead_when_elected(settings, runtime)

    # The leader's consumers are ensured by every replica, so a standby's takeover only starts
    # a broker on them.
    await serve_service(
        "tracker", settings, build, consumers=LEADER_CONSUMERS, database=True, run=run
    )
