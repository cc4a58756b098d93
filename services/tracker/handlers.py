"""The tracker's request handlers (every replica answers them): runs, imports, plans, queries.

Each delegates to its domain module; run creation and plan events append with an expected
sequence, imports are idempotent, and queries only read Postgres, so any replica may answer.
"""

from __future__ import annotations

from typing import Annotated

from faststream import Context

from rollout.services.tracker import imports, plans, queries, runs
from rollout.shared.bus.broker import jetstream, nats_client
from rollout.shared.bus.publisher import payload_budget
from rollout.shared.contracts.requests import (
    CancelRun,
    CreateRun,
    GetJob,
    GetRun,
    ImportRun,
    ListJobs,
    ListRuns,
    RecordPlanEvent,
    Reply,
)
from rollout.shared.objectstore import ObjectStore
from rollout.shared.service import durables
from rollout.shared.service.routes import CurrentBroker, Pool, caller, request_route
from rollout.shared.stack.lag_probe import LagProbe

QUEUE = "tracker"
# Claim-checked trajectories are read from it (put in the broker's context as `store`).
Store = Annotated[ObjectStore, Context("store")]
# The read models' lag each query answer carries (`readModels`): one probe per replica, so
# its cached consumer-info read serves every query for a moment.
READ_MODELS = LagProbe(durables.TRACKER_READ_MODELS)


async def create_run(cmd: CreateRun, broker: CurrentBroker, pool: Pool, store: Store) -> Reply:
    """Validate and record a run request; the fan-out happens from the event."""
    run = await runs.create_run(
        jetstream(broker), cmd, store, pool, caller(broker), nats_client(broker)
    )
    return Reply(data={"runId": run.run_id, **run.model_dump(mode="json")})


async def cancel_run(cmd: CancelRun, broker: CurrentBroker, pool: Pool) -> Reply:
    """End a running run as cancelled (an error if it is unknown or already ended)."""
    ending = await runs.cancel_run(jetstream(broker), pool, cmd, caller(broker))
    return Reply(data={"runId": ending.run_id, "status": "failed", "reason": ending.reason})


async def import_run(cmd: ImportRun, broker: CurrentBroker, store: Store) -> Reply:
    """Check and record an imported run; answers with its id (the same on a re-import)."""
    run, duplicate = await imports.import_run(jetstream(broker), cmd, store, caller(broker))
    return Reply(
        data={
            "runId": run.run_id,
            "duplicate": duplicate,
            "rollouts": len(cmd.rollouts),
            "envSlug": run.env_slug,
            "envVersion": run.env_version,
        }
    )


async def record_plan_event(cmd: RecordPlanEvent, broker: CurrentBroker) -> Reply:
    """Append one plan event, conditional on the plan's history being as the caller saw."""
    return Reply(data=await plans.record_plan_event(jetstream(broker), cmd, caller(broker)))


async def get_run(query: GetRun, broker: CurrentBroker, pool: Pool, store: Store) -> Reply:
    """One run: summary, per-task table, optionally rollouts."""
    js = jetstream(broker)
    run = await queries.get_run(pool, query, store, budget=payload_budget(js))
    # Only the first page's: a paged run is read in one go.
    if query.rollouts_cursor is None and query.tasks_cursor is None:
        run["readModels"] = await READ_MODELS.report(js)
    return Reply(data=run)


async def list_runs(query: ListRuns, broker: CurrentBroker, pool: Pool) -> Reply:
    """Recent runs, and how far behind the read models they come from are (`readModels`)."""
    runs = await queries.list_runs(pool, query)
    return Reply(data={"runs": runs, "readModels": await READ_MODELS.report(jetstream(broker))})


async def get_job(query: GetJob, pool: Pool) -> Reply:
    """One training job."""
    return Reply(data=await queries.get_job(pool, query))


async def list_jobs(query: ListJobs, pool: Pool) -> Reply:
    """Recent training jobs."""
    return Reply(data={"jobs": await queries.list_jobs(pool, query)})


ROUTES = [
    # Several at once: a creation may wait (seconds) on the actors' model check.
    request_route(
        create_run, "tracker", "create_run", queue=QUEUE, title="runs/create", max_workers=8
    ),
    request_route(cancel_run, "tracker", "cancel_run", queue=QUEUE, title="runs/cancel"),
    request_route(import_run, "tracker", "import_run", queue=QUEUE, title="runs/import"),
    request_route(
        record_plan_event, "tracker", "record_plan_event", queue=QUEUE, title="plans/record"
    ),
    request_route(get_run, "tracker", "get_run", queue=QUEUE, title="runs/get"),
    request_route(list_runs, "tracker", "list_runs", queue=QUEUE, title="runs/list"),
    request_route(get_job, "tracker", "get_job", queue=QUEUE, title="jobs/get"),
    request_route(list_jobs, "tracker", "list_jobs", queue=QUEUE, title="jobs/list"),
]
