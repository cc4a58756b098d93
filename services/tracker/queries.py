"""Read-side queries the CLI and Client ask the tracker (answers come from the read models).

No reply exceeds the server's max payload: a run's per-task table and its rollouts come in
pages that fit (keyset cursors: `tasksCursor` on task index, `rolloutsCursor` on task and
sample index), and a rollout whose trajectory alone would not fit comes without it, saying
where it is (`trajectoryOmitted`, `trajectoryUri`). A reply whose task page stopped short
holds no rollouts: they follow once the table is complete (its `rolloutsCursor` says where).
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from rollout.shared import subjects
from rollout.shared.bus.publisher import DEFAULT_MAX_PAYLOAD, HEADER_ROOM
from rollout.shared.contracts.requests import GetJob, GetRun, ListJobs, ListRuns
from rollout.shared.envs.judged import NOTHING_SCORED
from rollout.shared.errors import RolloutError
from rollout.shared.jsondepth import loads_bounded
from rollout.shared.objectstore import ObjectStore, to_json_bytes
from rollout.shared.stats import mean_score
from rollout.shared.store.judged_envs import envs_judging_nothing
from rollout.shared.store.run_stats import design_effects
from rollout.shared.store.trajectories import load_trajectory

QUEUE = "tracker"
# Bytes kept free in a reply for the Reply wrapper and the keys around the rollouts.
_REPLY_ROOM = 4 * 1024

_RUN_COLUMNS = (
    "run_id, name, env_slug, env_version, env_hash, model, n, split, parent_run_id, sampling,"
    " max_tool_calls, policy_version, status, total, generated, scored, passed, errored,"
    " score_sum, reason, created_at, started_at, finished_at, deadline_s, task_count, owner,"
    " budgets, source, released"
)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _env_version(row: asyncpg.Record) -> tuple[str, int, str]:
    return (row["env_slug"], row["env_version"], row["env_hash"])


async def no_verdicts(conn: asyncpg.Connection, rows: list[asyncpg.Record]) -> dict[str, str]:
    """Why each run whose env judges nothing has no pass rate, by run id (the rest absent).

    Decided here, once per env version (rollout.shared.store.judged_envs), so no reader of
    a run fetches its env's spec to find out.
    """
    empty = await envs_judging_nothing(conn, {_env_version(r) for r in rows})
    return {r["run_id"]: NOTHING_SCORED for r in rows if _env_version(r) in empty}


def run_summary(row: asyncpg.Record) -> dict[str, Any]:
    """A run as the Client sees it (camelCase keys, like the seed's API)."""
    scored = row["scored"]
    # Errored rollouts got no verdict: rates are over the verdicts only.
    judged = scored - row["errored"]
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
        # Started, nothing queued yet: its owner's earlier runs come first (the tracker's
        # ROLLOUT_RUNS_PER_OWNER).
        "waiting": row["status"] == "queued" and row.get("released") == 0,
        "total": row["total"],
        "generated": row["generated"],
        "scored": scored,
        "passed": row["passed"],
        "errored": row["errored"],
        "failed": judged - row["passed"],
        "passRate": row["passed"] / judged if judged > 0 else 0.0,
        "meanScore": mean_score(row["score_sum"], judged),
        "reason": row["reason"],
        "taskCount": row["task_count"],
        # Who started it (a key's NATS user, a service's, the admin's); None before owners.
        "owner": row.get("owner"),
        # The run's budget overrides (None: the env's, else the platform's defaults).
        "budgets": json.loads(row["budgets"]) if row.get("budgets") else None,
        # Where an imported run's rewards came from (None: scored by this platform's verifier).
        "source": row.get("source"),
        "createdAt": _iso(row["created_at"]),
        "startedAt": _iso(row["started_at"]),
        "finishedAt": _iso(row["finished_at"]),
        # Why its passRate and meanScore measure nothing (its env judges nothing: a prompts
        # file without answers, its "passed" only "no tool error"); None for a judged run.
        # `get_run` and `list_runs` set it (`no_verdicts`).
        "noVerdict": None,
    }


# What ended a rollout that has turns: its budget; else it errored, or the model finished
# (the same words per rollout, `ended_by`, and per run, `endings_summary`).
_ENDED = "coalesce(ended_by, case when status = 'errored' then 'errored' else 'model' end)"


def ended_by(row: asyncpg.Record) -> str | None:
    """The budget that ended the rollout, `errored`, `model`; None before it has turns."""
    if row["turns"] is None:
        return None
    return row["ended_by"] or ("errored" if row["status"] == "errored" else "model")


def endings_summary(rows: list[asyncpg.Record]) -> dict[str, Any]:
    """Per ending (the budget, else `errored` or `model`), rollouts; mean turns and tokens."""
    count = sum(r["n"] for r in rows)
    return {
        "endedBy": {r["ended"]: r["n"] for r in rows},
        "meanTurns": sum(r["turns"] or 0 for r in rows) / count if count else None,
        "meanCompletionTokens": sum(r["tokens"] or 0 for r in rows) / count if count else None,
    }


# The SQL that selects each outcome of `outcome_of` (fixed strings: nothing of the query's).
_OUTCOME_FILTERS: dict[str | None, str] = {
    None: "",
    "errored": " and status = 'errored'",
    "pending": " and status <> 'errored' and scored_at is null",
    "passed": " and status <> 'errored' and scored_at is not null and passed",
    "failed": " and status <> 'errored' and scored_at is not null and not passed",
}


def outcome_of(row: asyncpg.Record) -> str | None:
    """passed / failed / errored, or None while the rollout awaits its verdict."""
    if row["status"] == "errored":
        return "errored"
    if row["scored_at"] is None:
        return None
    return "passed" if row["passed"] else "failed"


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
        "outcome": outcome_of(row),
        "errorKind": row["error_kind"],
        "primitives": json.loads(row["primitives"]) if row["primitives"] else [],
        "trajectoryUri": row["trajectory_uri"],
        "trajectorySha256": row["trajectory_sha256"],
        "endedBy": ended_by(row),
        "turns": row["turns"],
        "completionTokens": row["completion_tokens"],
    }
    if with_trajectory:
        # Cut at a depth: one nested past what json.loads reads failed the whole run's reply
        # (and `rollout export`), and the reply's own JSON stops at about 255 levels.
        out["trajectory"] = loads_bounded(row["trajectory"]) if row["trajectory"] else None
    return out


async def get_run(
    pool: asyncpg.Pool,
    query: GetRun,
    store: ObjectStore | None = None,
    *,
    budget: int = DEFAULT_MAX_PAYLOAD - HEADER_ROOM,
) -> dict[str, Any]:
    """A run with its per-task table (and a page of its rollouts, at most `budget` bytes)."""
    subjects.token(query.run_id, "run id")
    after = _parse_cursor(query.rollouts_cursor)
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            f"select {_RUN_COLUMNS} from runs where run_id = $1", query.run_id
        )
        if row is None:
            raise RolloutError(f"no run {query.run_id!r} (see `rollout runs`)")
        no_verdict = (await no_verdicts(conn, [row])).get(query.run_id)
        # How the run's rollouts ended: by which budget, else errored or by the model.
        endings = await conn.fetch(
            f"select {_ENDED} as ended, count(*) as n, sum(turns) as turns,"
            " sum(completion_tokens) as tokens from rollouts where run_id = $1"
            " and turns is not null group by 1",
            query.run_id,
        )
        tasks = []
        if query.include_tasks:
            # One more than a page: whether another page follows.
            tasks = await conn.fetch(
                "select task_index, count(*) as n,"
                " count(*) filter (where passed and status <> 'errored') as passed,"
                " count(*) filter (where status = 'errored') as errored,"
                " coalesce(avg(score) filter (where status <> 'errored'), 0) as mean_score,"
                " count(score) as scored"
                " from rollouts where run_id = $1 and task_index > $2"
                " group by task_index order by task_index limit $3",
                query.run_id,
                -1 if query.tasks_cursor is None else query.tasks_cursor,
                query.tasks_page_size + 1,
            )
        rollouts = []
        if query.include_rollouts:
            # One more than a page: whether another page follows.
            rollouts = await conn.fetch(
                "select * from rollouts where run_id = $1 and (task_index, sample_index) > ($2, $3)"
                f"{_OUTCOME_FILTERS[query.outcome]} order by task_index, sample_index limit $4",
                query.run_id,
                after[0],
                after[1],
                query.page_size + 1,
            )
    out = run_summary(row) | {"noVerdict": no_verdict} | endings_summary(endings)
    tasks_cut = False
    if query.include_tasks:
        room = budget - len(to_json_bytes(out)) - _REPLY_ROOM
        out["tasks"], more_tasks = _task_page(tasks, query.tasks_page_size, room)
        last_task = out["tasks"][-1]["taskIndex"] if out["tasks"] else None
        tasks_cut = more_tasks and last_task is not None
        out["tasksCursor"] = last_task if tasks_cut else None
    if query.include_rollouts and tasks_cut:
        # The table takes this reply: the rollouts start in a later one, from where asked.
        out["rollouts"] = []
        out["rolloutsCursor"] = f"{after[0]}.{after[1]}"
    elif query.include_rollouts:
        room = budget - len(to_json_bytes(out)) - _REPLY_ROOM
        page, more = await _rollout_page(rollouts, query, store, room)
        out["rollouts"] = page
        last = page[-1] if page else None
        out["rolloutsCursor"] = (
            f"{last['taskIndex']}.{last['sampleIndex']}" if more and last is not None else None
        )
    return out


def task_row(t: asyncpg.Record) -> dict[str, Any]:
    """One row of a run's per-task table."""
    judged = t["scored"] - t["errored"]
    return {
        "taskIndex": t["task_index"],
        "n": t["n"],
        "scored": t["scored"],
        "passed": t["passed"],
        "errored": t["errored"],
        "failed": judged - t["passed"],
        "passRate": t["passed"] / judged if judged else 0.0,
        "meanScore": float(t["mean_score"]),
    }


def _task_page(
    rows: list[asyncpg.Record], page_size: int, room: int
) -> tuple[list[dict[str, Any]], bool]:
    """As many task rows as fit in `room` bytes (a page at most, one at least); more to come?"""
    page: list[dict[str, Any]] = []
    used = 0
    for record in rows[:page_size]:
        item = task_row(record)
        size = len(to_json_bytes(item)) + 1
        if page and used + size > room:
            return page, True
        page.append(item)
        used += size
    return page, len(rows) > page_size


def _parse_cursor(cursor: str | None) -> tuple[int, int]:
    """(task_index, sample_index) after which the page starts; before everything when None."""
    if cursor is None:
        return (-1, -1)
    task, _, sample = cursor.partition(".")
    try:
        return (int(task), int(sample))
    except ValueError:
        raise RolloutError(
            f"rollouts_cursor {cursor!r} is not a cursor this tracker gave out",
            problems=[
                "pass the `rolloutsCursor` of the previous reply, or none for the first page"
            ],
        ) from None


async def _rollout_page(
    rows: list[asyncpg.Record], query: GetRun, store: ObjectStore | None, room: int
) -> tuple[list[dict[str, Any]], bool]:
    """As many rows as fit in `room` bytes (at most a page), and whether more follow."""
    page: list[dict[str, Any]] = []
    used = 0
    for record in rows[: query.page_size]:
        item = rollout_row(record, with_trajectory=query.include_trajectories)
        if query.include_trajectories and store is not None:
            item["trajectory"] = await load_trajectory(
                store, item["trajectory"], item["trajectoryUri"], item["trajectorySha256"]
            )
        size = len(to_json_bytes(item)) + 1
        if size > room and query.include_trajectories:
            # Alone too large for any reply: it comes without its trajectory, saying so.
            item["trajectory"] = None
            item["trajectoryOmitted"] = (
                f"the trajectory is {size} bytes, more than one reply may carry; "
                + (f"it is at {item['trajectoryUri']}" if item["trajectoryUri"] else "replay it")
            )
            size = len(to_json_bytes(item)) + 1
        if page and used + size > room:
            return page, True
        page.append(item)
        used += size
    return page, len(rows) > query.page_size


async def list_runs(pool: asyncpg.Pool, query: ListRuns) -> list[dict[str, Any]]:
    """Newest runs first, each with its design effect over its tasks (`designEffect`)."""
    limit = max(1, min(query.limit, 1000))
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            f"select {_RUN_COLUMNS} from runs where ($1::text is null or env_slug = $1)"
            " and ($2::text is null or owner = $2) order by created_at desc limit $3",
            query.env_slug or None,
            query.owner,
            limit,
        )
        effects = await design_effects(conn, rows)
        unjudged = await no_verdicts(conn, rows)
    return [
        run_summary(r)
        | {"designEffect": effects.get(r["run_id"], 1.0), "noVerdict": unjudged.get(r["run_id"])}
        for r in rows
    ]


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
        "owner": row.get("owner"),
        "createdAt": _iso(row["created_at"]),
        "updatedAt": _iso(row["updated_at"]),
    }


async def get_job(pool: asyncpg.Pool, query: GetJob) -> dict:
    """One training job."""
    subjects.token(query.job_id, "job id")
    async with pool.acquire() as conn:
        row = await conn.fetchrow("select * from jobs where job_id = $1", query.job_id)
    if row is None:
        raise RolloutError(f"no training job {query.job_id!r} (see `rollout jobs`)")
    return job_row(row)


async def list_jobs(pool: asyncpg.Pool, query: ListJobs) -> list[dict]:
    """Recent training jobs."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "select * from jobs where ($1::text is null or owner = $1)"
            " order by created_at desc limit $2",
            query.owner,
            max(1, min(query.limit, 1000)),
        )
    return [job_row(r) for r in rows]
