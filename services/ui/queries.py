"""The viewer's reads of the tracker's read models: paginated, aggregated in the database."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from rollout.shared.auth.ownership import describe as describe_user
from rollout.shared.envs.judged import NOTHING_SCORED
from rollout.shared.jsondepth import loads_bounded
from rollout.shared.stats import mean_score, wilson_interval
from rollout.shared.store.judged_envs import envs_judging_nothing
from rollout.shared.store.run_stats import design_effects

PAGE = 50
HIST_BINS = 10

_RUN_COLUMNS = (
    "run_id, name, env_slug, env_version, env_hash, model, n, split, parent_run_id, sampling,"
    " max_tool_calls, policy_version, status, total, generated, scored, passed, errored,"
    " score_sum, reason, created_at, started_at, finished_at, task_count, owner, source"
)


def run_view(row: asyncpg.Record, effect: float = 1.0) -> dict[str, Any]:
    """A run row with its pass rate, 95% Wilson interval and progress; `effect` is the run's
    design effect over its tasks (several samples of a task are not independent trials)."""
    out = dict(row)
    scored, total = row["scored"], row["total"]
    # Rates are over verdicts, as the CLI's and the tracker's are: an errored rollout (scored,
    # but with no verdict) is no trial and no zero.
    judged = scored - (row.get("errored") or 0)
    out["judged"] = judged
    out["pass_rate"] = row["passed"] / judged if judged > 0 else None
    out["design_effect"] = effect
    # As `rollout compare` counts them: as many trials as the task clustering leaves.
    out["interval"] = (
        wilson_interval(row["passed"] / effect, judged / effect) if judged > 0 else None
    )
    out["mean_score"] = mean_score(row["score_sum"], judged) if judged > 0 else None
    out["progress"] = scored / total if total else 0.0
    # Who started it, in words (`key 1a2b3c4d5e6f`); None for runs from before owners.
    out["started_by"] = describe_user(row["owner"]) if row.get("owner") else None
    if isinstance(out.get("sampling"), str):
        out["sampling"] = json.loads(out["sampling"])
    return out


async def run_views(conn: asyncpg.Connection, rows: list[asyncpg.Record]) -> list[dict[str, Any]]:
    """`run_view` of each row, with its design effect from its tasks' counts (one query for
    the runs with several samples per task; 1 for the rest), and no pass rate for the runs
    whose env judges nothing (`no_verdict` says why)."""
    effects = await design_effects(conn, rows)
    views = [run_view(r, effects.get(r["run_id"], 1.0)) for r in rows]
    empty = await envs_judging_nothing(
        conn, {(r["env_slug"], r["env_version"], r["env_hash"]) for r in rows}
    )
    for view in views:
        view["no_verdict"] = None
        if (view["env_slug"], view["env_version"], view["env_hash"]) in empty:
            # Its 100% measured nothing: as `rollout show` gives it, no rate and the reason.
            view.update(no_verdict=NOTHING_SCORED, pass_rate=None, interval=None,
                        mean_score=None)  # fmt: skip
    return views


def _offset(page: int) -> int:
    return max(0, page - 1) * PAGE


async def list_runs(
    conn: asyncpg.Connection,
    *,
    env: str | None = None,
    model: str | None = None,
    status: str | None = None,
    page: int = 1,
) -> dict[str, Any]:
    """Newest runs first, filtered; one extra row tells whether a next page exists."""
    rows = await conn.fetch(
        f"select {_RUN_COLUMNS} from runs where ($1::text is null or env_slug = $1)"
        " and ($2::text is null or model = $2) and ($3::text is null or status = $3)"
        " order by created_at desc, run_id limit $4 offset $5",
        env, model, status, PAGE + 1, _offset(page),
    )  # fmt: skip
    facets = await conn.fetchrow(
        "select array(select distinct env_slug from runs order by 1) as envs,"
        " array(select distinct model from runs order by 1) as models,"
        " array(select distinct status from runs order by 1) as statuses"
    )
    return {
        "runs": await run_views(conn, rows[:PAGE]),
        "more": len(rows) > PAGE,
        "envs": facets["envs"],
        "models": facets["models"],
        "statuses": facets["statuses"],
    }


async def get_run(conn: asyncpg.Connection, run_id: str) -> dict[str, Any] | None:
    """One run's summary row."""
    row = await conn.fetchrow(f"select {_RUN_COLUMNS} from runs where run_id = $1", run_id)
    return (await run_views(conn, [row]))[0] if row else None


def _task_view(t: asyncpg.Record) -> dict[str, Any]:
    out = dict(t)
    out["pass_rate"] = t["passed"] / t["scored"] if t["scored"] else None
    out["interval"] = wilson_interval(t["passed"], t["scored"]) if t["scored"] else None
    return out


_TASK_SELECT = (
    "select task_index, count(*) as n, count(score) as scored,"
    " count(*) filter (where passed) as passed,"
    " count(*) filter (where status = 'errored') as errored, avg(score) as mean_score,"
    " (array_agg(rollout_id order by sample_index))[1:8] as samples,"
    " (array_agg(passed order by sample_index))[1:8] as sample_passed"
    " from rollouts where run_id = $1"
)


async def run_tasks(
    conn: asyncpg.Connection, run_id: str, *, page: int = 1, only: list[int] | None = None
) -> dict[str, Any]:
    """The per-task table, one page of tasks (or just the tasks in `only`)."""
    if only is not None:
        rows = await conn.fetch(
            _TASK_SELECT + " and task_index = any($2::int[]) group by task_index"
            " order by task_index",
            run_id,
            only,
        )
        return {"tasks": [_task_view(t) for t in rows], "more": False}
    rows = await conn.fetch(
        _TASK_SELECT + " group by task_index order by task_index limit $2 offset $3",
        run_id,
        PAGE + 1,
        _offset(page),
    )
    return {"tasks": [_task_view(t) for t in rows[:PAGE]], "more": len(rows) > PAGE}


async def run_primitives(conn: asyncpg.Connection, run_id: str) -> list[dict[str, Any]]:
    """Per verifier primitive: how often it passed and its mean score."""
    rows = await conn.fetch(
        # jsonb_to_recordset reads each verdict once (half the time of ->> per field).
        "select p.name, p.type, count(*) as n, count(*) filter (where p.passed) as passed,"
        " avg(p.score) as mean_score from rollouts r cross join lateral"
        " jsonb_to_recordset(r.primitives) as p(name text, type text, passed boolean, score float8)"
        " where r.run_id = $1 and jsonb_typeof(r.primitives) = 'array'"
        " group by 1, 2 order by 1",
        run_id,
    )
    out = []
    for r in rows:
        item = dict(r)
        item["pass_rate"] = r["passed"] / r["n"] if r["n"] else None
        item["interval"] = wilson_interval(r["passed"], r["n"])
        out.append(item)
    return out


async def score_histogram(conn: asyncpg.Connection, run_id: str) -> list[int]:
    """Counts of scores in HIST_BINS equal bins over [0, 1] (1.0 falls in the last bin)."""
    rows = await conn.fetch(
        "select least(greatest(width_bucket(score, 0, 1, $2), 1), $2) as b, count(*) as n"
        " from rollouts where run_id = $1 and score is not null group by 1",
        run_id,
        HIST_BINS,
    )
    counts = [0] * HIST_BINS
    for r in rows:
        counts[r["b"] - 1] += r["n"]
    return counts


async def task_samples(
    conn: asyncpg.Connection, run_id: str, task_index: int, *, page: int = 1
) -> dict[str, Any]:
    """Every sample of one task (a page of them)."""
    rows = await conn.fetch(
        "select rollout_id, sample_index, status, score, passed, error, seed, policy_version"
        " from rollouts where run_id = $1 and task_index = $2 order by sample_index"
        " limit $3 offset $4",
        run_id, task_index, PAGE + 1, _offset(page),
    )  # fmt: skip
    return {"samples": [dict(r) for r in rows[:PAGE]], "more": len(rows) > PAGE}


async def get_rollout(conn: asyncpg.Connection, rollout_id: str) -> dict[str, Any] | None:
    """One rollout with its run's env, hash and sampling."""
    row = await conn.fetchrow(
        "select r.*, u.env_slug, u.env_version, u.env_hash, u.sampling, u.name as run_name"
        " from rollouts r join runs u on u.run_id = r.run_id where r.rollout_id = $1",
        rollout_id,
    )
    if row is None:
        return None
    out = dict(row)
    for key in ("trajectory", "primitives", "sampling"):
        if isinstance(out.get(key), str):
            # Cut at a depth: a tool result nested 2,000 deep made json.loads (and the page's
            # rendering after it) raise RecursionError, a bare 500 for the rollout's page.
            out[key] = loads_bounded(out[key])
    return out


async def get_env(conn: asyncpg.Connection, slug: str) -> dict[str, Any] | None:
    """An env's newest version and its last audit (None when the env is unknown)."""
    row = await conn.fetchrow(
        "select slug, version, spec_hash, name, template, task_count, registered_at"
        " from environments where slug = $1 order by version desc limit 1",
        slug,
    )
    if row is None:
        return None
    env = dict(row)
    audit = await conn.fetchrow(
        "select * from env_audits where slug = $1 order by audited_at desc limit 1", slug
    )
    env["audit"] = None
    if audit is not None:
        env["audit"] = dict(audit)
        for key in ("policies", "hackable_tasks", "findings", "policy_errors"):
            if isinstance(env["audit"][key], str):
                env["audit"][key] = json.loads(env["audit"][key])
    return env


async def policy_weights(conn: asyncpg.Connection, model: str, since: int) -> dict[int, str]:
    """The weights digests the learner announced for `model`'s versions from `since` on."""
    rows = await conn.fetch(
        "select version, weights_sha256 from policies where model = $1 and version >= $2"
        " and weights_sha256 is not null",
        model,
        since,
    )
    return {int(r["version"]): str(r["weights_sha256"]) for r in rows}


async def trained_on(conn: asyncpg.Connection, rollout_id: str) -> list[dict[str, Any]]:
    """The policy versions whose step trained on this rollout, newest first."""
    rows = await conn.fetch(
        "select model, version, job_id, signals_uri, signals_sha256 from trained_rollouts"
        " where rollout_id = $1 order by version desc, model",
        rollout_id,
    )
    return [dict(r) for r in rows]


async def compare_tasks(
    conn: asyncpg.Connection, a: str, b: str, *, page: int = 1
) -> dict[str, Any]:
    """Per-task pass rates of two runs side by side, their deltas, and the flipped tasks.

    One scan of both runs' rollouts; window counts give the task-set sizes, and the page's
    rows and every flipped task come back together.
    """
    rows = await conn.fetch(
        "with per as (select task_index,"
        " count(score) filter (where run_id = $1) as a_n,"
        " count(*) filter (where run_id = $1 and passed) as a_p,"
        " avg(score) filter (where run_id = $1) as a_s,"
        " count(score) filter (where run_id = $2) as b_n,"
        " count(*) filter (where run_id = $2 and passed) as b_p,"
        " avg(score) filter (where run_id = $2) as b_s,"
        " bool_or(run_id = $1) as in_a, bool_or(run_id = $2) as in_b"
        " from rollouts where run_id = any(array[$1, $2]::text[]) group by task_index),"
        " rates as (select *, case when a_n > 0 then a_p::float8 / a_n end as a_rate,"
        " case when b_n > 0 then b_p::float8 / b_n end as b_rate from per),"
        " k as (select *, b_rate - a_rate as delta,"
        " coalesce((a_rate >= 0.5) <> (b_rate >= 0.5), false) as flipped,"
        " row_number() over (order by task_index) as rn,"
        " count(*) filter (where in_a) over () as a_tasks,"
        " count(*) filter (where in_b) over () as b_tasks,"
        " count(*) filter (where in_a and in_b) over () as common from rates)"
        " select * from k where (rn > $3 and rn <= $3 + $4) or flipped order by task_index",
        a, b, _offset(page), PAGE + 1,
    )  # fmt: skip
    offset = _offset(page)
    in_page = [dict(r) for r in rows if offset < r["rn"] <= offset + PAGE + 1]
    first = rows[0] if rows else None
    return {
        "tasks": in_page[:PAGE],
        "more": len(in_page) > PAGE,
        "flipped": [dict(r) for r in rows if r["flipped"]][:200],
        "sets": {
            "a_tasks": first["a_tasks"] if first else 0,
            "b_tasks": first["b_tasks"] if first else 0,
            "common": first["common"] if first else 0,
        },
    }


async def first_sample(
    conn: asyncpg.Connection, run_id: str, task_index: int
) -> dict[str, Any] | None:
    """The first sample of a task in a run (for side-by-side trajectories)."""
    row = await conn.fetchrow(
        "select rollout_id from rollouts where run_id = $1 and task_index = $2"
        " order by sample_index limit 1",
        run_id,
        task_index,
    )
    return await get_rollout(conn, row["rollout_id"]) if row else None


async def list_jobs(conn: asyncpg.Connection, *, page: int = 1) -> dict[str, Any]:
    """Training jobs, newest first."""
    rows = await conn.fetch(
        "select * from jobs order by created_at desc, job_id limit $1 offset $2",
        PAGE + 1,
        _offset(page),
    )
    return {"jobs": [dict(r) for r in rows[:PAGE]], "more": len(rows) > PAGE}


async def get_job(conn: asyncpg.Connection, job_id: str) -> dict[str, Any] | None:
    """One job, its checkpoints, its policy versions and the runs that evaluated each."""
    row = await conn.fetchrow("select * from jobs where job_id = $1", job_id)
    if row is None:
        return None
    job = dict(row)
    if isinstance(job.get("hyperparams"), str):
        job["hyperparams"] = json.loads(job["hyperparams"])
    job["checkpoints"] = [
        dict(r)
        for r in await conn.fetch(
            "select step, uri, sha256, size_bytes, saved_at from checkpoints where job_id = $1"
            " order by step limit 500",
            job_id,
        )
    ]
    policies = await conn.fetch(
        "select model, version, checkpoint_uri, sha256, updated_at from policies"
        " where job_id = $1 order by version limit 200",
        job_id,
    )
    names = {job_id} | ({job["model_id"]} if job["model_id"] else set())
    versions = []
    for p in policies:
        runs = await conn.fetch(
            f"select {_RUN_COLUMNS} from runs where model = any($1::text[])"
            " and policy_version = $2 order by created_at desc limit 20",
            sorted(names | {p["model"]}),
            p["version"],
        )
        versions.append(dict(p) | {"runs": await run_views(conn, list(runs))})
    job["policies"] = versions
    return job
