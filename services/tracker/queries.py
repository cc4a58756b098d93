"""Read-side queries the CLI and Client ask the tracker (answers come from the read models)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
from faststream.nats import NatsBroker

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.contracts.requests import GetJob, GetRun, ListJobs, ListRuns, Reply
from rollout.shared.objectstore import ObjectStore
from rollout.shared.store.trajectories import load_trajectory

QUEUE = "tracker"

_RUN_COLUMNS = (
    "run_id, name, env_slug, env_version, env_hash, model, n, split, parent_run_id, sampling,"
    " max_tool_calls, policy_version, status, total, generated, scored, passed, errored,"
    " score_sum, reason, created_at, started_at, finished_at, deadline_s, task_count"
)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def run_summary(row: asyncpg.Record) -> dict[str, Any]:
    """A run as the Client sees it (camelCase keys, like the seed's API)."""
    scored = row["scored"]
    return {
        "runId": row["run_id"],
        "name": row["name"],
        "envSlug": row["env_slug"],
        "envVersion": row["env_version"],
        "envHash": row["env_hash"],
        "model": row["model"],
        "n": row["n"],
        "split": row["split"],
        "parentRunId": row["parent_run_id"],
        "sampling": json.loads(row["sampling"]),
        "maxToolCalls": row["max_tool_calls"],
        "policyVersion": row["policy_version"],
        "status": row["status"],
        "total": row["total"],
        "generated": row["generated"],
        "scored": scored,
        "passed": row["passed"],
        "errored": row["errored"],
        "passRate": row["passed"] / scored if scored else 0.0,
        "meanScore": row["score_sum"] / scored if scored else 0.0,
        "reason": row["reason"],
        "taskCount": row["task_count"],
        "createdAt": _iso(row["created_at"]),
        "startedAt": _iso(row["started_at"]),
        "finishedAt": _iso(row["finished_at"]),
    }


def rollout_row(row: asyncpg.Record, *, with_trajectory: bool) -> dict[str, Any]:
    """One rollout (camelCase keys)."""
    out = {
        "rolloutId": row["rollout_id"],
        "runId": row["run_id"],
        "taskIndex": row["task_index"],
        "sampleIndex": row["sample_index"],
        "status": row["status"],
        "model": row["model"],
        "policyVersion": row["policy_version"],
        "seed": row["seed"],
        "score": row["score"],
        "passed": row["passed"],
        "error": row["error"],
        "primitives": json.loads(row["primitives"]) if row["primitives"] else [],
        "trajectoryUri": row["trajectory_uri"],
        "trajectorySha256": row["trajectory_sha256"],
    }
    if with_trajectory:
        out["trajectory"] = json.loads(row["trajectory"]) if row["trajectory"] else None
    return out


async def get_run(
    pool: asyncpg.Pool, query: GetRun, store: ObjectStore | None = None
) -> dict[str, Any]:
    """A run with its per-task table (and its rollouts when asked)."""
    subjects.token(query.run_id, "run id")
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            f"select {_RUN_COLUMNS} from runs where run_id = $1", query.run_id
        )
        if row is None:
            raise RolloutError(f"no run {query.run_id!r} (see `rollout runs`)")
        tasks = await conn.fetch(
            "select task_index, count(*) as n, count(*) filter (where passed) as passed,"
            " count(*) filter (where status = 'errored') as errored,"
            " coalesce(avg(score), 0) as mean_score, count(score) as scored"
            " from rollouts where run_id = $1 group by task_index order by task_index",
            query.run_id,
        )
        rollouts = []
        if query.include_rollouts:
            rollouts = await conn.fetch(
                "select * from rollouts where run_id = $1 order by task_index, sample_index",
                query.run_id,
            )
    out = run_summary(row)
    out["tasks"] = [
        {
            "taskIndex": t["task_index"],
            "n": t["n"],
            "scored": t["scored"],
            "passed": t["passed"],
            "errored": t["errored"],
            "passRate": t["passed"] / t["scored"] if t["scored"] else 0.0,
            "meanScore": float(t["mean_score"]),
        }
        for t in tasks
    ]
    if query.include_rollouts:
        out["rollouts"] = [
            rollout_row(r, with_trajectory=query.include_trajectories) for r in rollouts
        ]
        if query.include_trajectories and store is not None:
            for row in out["rollouts"]:
                row["trajectory"] = await load_trajectory(
                    store, row["trajectory"], row["trajectoryUri"], row["trajectorySha256"]
                )
    return out


async def list_runs(pool: asyncpg.Pool, query: ListRuns) -> list[dict[str, Any]]:
    """Newest runs first."""
    limit = max(1, min(query.limit, 1000))
    async with pool.acquire() as conn:
        if query.env_slug:
            rows = await conn.fetch(
                f"select {_RUN_COLUMNS} from runs where env_slug = $1"
                " order by created_at desc limit $2",
                query.env_slug,
                limit,
            )
        else:
            rows = await conn.fetch(
                f"select {_RUN_COLUMNS} from runs order by created_at desc limit $1", limit
            )
    return [run_summary(r) for r in rows]


def job_row(row: asyncpg.Record) -> dict[str, Any]:
    """A training job (camelCase keys)."""
    return {
        "id": row["job_id"],
        "jobId": row["job_id"],
        "method": row["method"],
        "baseModel": row["base_model"],
        "sourceRunId": row["source_run_id"],
        "envSlug": row["env_slug"],
        "suffix": row["suffix"],
        "hyperparams": json.loads(row["hyperparams"]),
        "status": row["status"],
        "step": row["step"],
        "totalSteps": row["total_steps"],
        "loss": row["loss"],
        "reward": row["reward"],
        "tokensPerS": row["tokens_per_s"],
        "etaS": row["eta_s"],
        "modelId": row["model_id"],
        "checkpointUri": row["checkpoint_uri"],
        "reason": row["reason"],
        "createdAt": _iso(row["created_at"]),
        "updatedAt": _iso(row["updated_at"]),
    }


def register(broker: NatsBroker, pool: asyncpg.Pool, store: ObjectStore | None = None) -> None:
    """Attach the query handlers to `broker` (claim-checked trajectories come from `store`)."""

    @broker.subscriber(subjects.request("tracker", "get_run"), queue=QUEUE, title="runs/get")
    async def get_run_handler(query: GetRun) -> Reply:
        """One run: summary, per-task table, optionally rollouts."""
        return Reply(data=await get_run(pool, query, store))

    @broker.subscriber(subjects.request("tracker", "list_runs"), queue=QUEUE, title="runs/list")
    async def list_runs_handler(query: ListRuns) -> Reply:
        """Recent runs."""
        return Reply(data={"runs": await list_runs(pool, query)})

    @broker.subscriber(subjects.request("tracker", "get_job"), queue=QUEUE, title="jobs/get")
    async def get_job_handler(query: GetJob) -> Reply:
        """One training job."""
        subjects.token(query.job_id, "job id")
        async with pool.acquire() as conn:
            row = await conn.fetchrow("select * from jobs where job_id = $1", query.job_id)
        if row is None:
            raise RolloutError(f"no training job {query.job_id!r} (see `rollout jobs`)")
        return Reply(data=job_row(row))

    @broker.subscriber(subjects.request("tracker", "list_jobs"), queue=QUEUE, title="jobs/list")
    async def list_jobs_handler(query: ListJobs) -> Reply:
        """Recent training jobs."""
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "select * from jobs order by created_at desc limit $1",
                max(1, min(query.limit, 1000)),
            )
        return Reply(data={"jobs": [job_row(r) for r in rows]})
