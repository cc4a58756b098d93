"""The tracker's read models: one small function per event type, all inside the caller's tx."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import asyncpg

from rollout.shared.contracts import events as ev
from rollout.shared.contracts.envelope import EventEnvelope, Payload
from rollout.shared.store.jsonb import jsonb_text
from rollout.shared.store.rollout_batch import Handler, RolloutBatch, apply_events, columns

Apply = Callable[[asyncpg.Connection, EventEnvelope, Payload], Awaitable[None]]
_HANDLERS: dict[str, Handler] = {}


def on(event_type: str) -> Callable[[Apply], Apply]:
    """Register the read-model update for one event type (rollout events are batched)."""

    def wrap(fn: Apply) -> Apply:
        async def handler(c: asyncpg.Connection, e: EventEnvelope, p: Payload, _: int) -> None:
            await fn(c, e, p)

        _HANDLERS[event_type] = handler
        return fn

    return wrap


def _json(value: object) -> str:
    return jsonb_text(value)


# Lifecycle updates apply only to what has not ended: the first ending in stream order stays,
# and a late or repeated run.started / job.progress never moves an ended one back.
_OPEN = "status not in ('completed', 'failed')"


@on("env.registered")
async def _env_registered(c: asyncpg.Connection, e: EventEnvelope, p: ev.EnvRegistered) -> None:
    await c.execute(
        "insert into environments(slug, version, spec_hash, name, template, task_count, spec,"
        " registered_at, owner) values ($1,$2,$3,$4,$5,$6,$7::jsonb,$8,$9) on conflict do nothing",
        p.slug, p.version, p.spec_hash, p.name, p.template, p.task_count, _json(p.spec), e.time,
        p.owner,
    )  # fmt: skip


@on("env.audited")
async def _env_audited(c: asyncpg.Connection, e: EventEnvelope, p: ev.EnvAudited) -> None:
    await c.execute(
        "insert into env_audits(event_id, slug, version, split, threshold, tasks, policies,"
        " hackable_tasks, findings, findings_total, errors, seconds, audited_at, policy_errors)"
        " values ($1,$2,$3,$4,$5,$6,$7::jsonb,$8::jsonb,$9::jsonb,$10,$11,$12,$13,$14::jsonb)"
        " on conflict do nothing",
        e.id, p.slug, p.version, p.split, p.threshold, p.tasks, _json(p.policies),
        _json(p.hackable_tasks), _json(p.findings), p.findings_total, p.errors, p.seconds,
        e.time, _json(p.policy_errors),
    )  # fmt: skip


@on("run.requested")
async def _run_requested(c: asyncpg.Connection, e: EventEnvelope, p: ev.RunRequested) -> None:
    await c.execute(
        "insert into runs(run_id, name, env_slug, env_version, env_hash, model, n, split,"
        " parent_run_id, sampling, max_tool_calls, policy_version, status, created_at,"
        " deadline_s, task_count, owner, budgets, source, deadline_from)"
        " values ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10::jsonb,$11,$12,'queued',$13,$14,$15,$16,"
        "$17::jsonb,$18,$13) on conflict do nothing",
        p.run_id, p.name, p.env_slug, p.env_version, p.env_hash, p.model, p.n, p.split,
        p.parent_run_id, _json(p.sampling.model_dump(mode="json")), p.max_tool_calls,
        p.policy_version, e.time, p.deadline_s, len(p.task_indices), p.owner,
        _json(p.budgets.model_dump(mode="json", exclude_none=True)) if p.budgets else None,
        p.source,
    )  # fmt: skip


@on("run.started")
async def _run_started(c: asyncpg.Connection, e: EventEnvelope, p: ev.RunStarted) -> None:
    # A run that waits for its owner's earlier runs (window 0) stays queued, with no deadline
    # yet, until its first release.
    waits = p.window == 0
    await c.execute(
        "update runs set total = $2, work_items = $4, released = $5::int,"
        " status = case when $6::bool then status else 'running' end,"
        " started_at = case when $6::bool then null else $3::timestamptz end,"
        f" deadline_from = case when $6::bool then null else deadline_from end where run_id = $1"
        f" and {_OPEN}",
        p.run_id, p.total_rollouts, e.time, p.work_items,
        p.window if p.window is not None and p.window < p.work_items else None, waits,
    )  # fmt: skip


@on("run.work_released")
async def _work_released(c: asyncpg.Connection, e: EventEnvelope, p: ev.WorkReleased) -> None:
    await c.execute(
        "update runs set released = greatest(released, $2), status = 'running',"
        " started_at = coalesce(started_at, $3), deadline_from = coalesce(deadline_from, $3)"
        f" where run_id = $1 and released is not null and {_OPEN}",
        p.run_id, p.released, e.time,
    )  # fmt: skip


# The two hot event types are applied a whole group at a time: one statement per type for
# every rollout of the group, each also moving its runs' counters (see ReadModels.apply_batch).
_GENERATED_SQL = (
    "with ins as (insert into rollouts(rollout_id, run_id, task_index, sample_index, status,"
    " model, policy_version, seed, trajectory, trajectory_uri, trajectory_sha256, error,"
    " error_kind, generated_at, ended_by, turns, completion_tokens, generated_seq)"
    " select u.id, u.run, u.task,"
    " u.sample, 'generated', u.model, u.policy, u.seed, u.trajectory::jsonb, u.uri, u.sha,"
    " u.error, u.kind, u.at, u.ended, u.turns, u.tokens, u.seq"
    " from unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::text[], $6::int[],"
    " $7::bigint[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],"
    " $13::timestamptz[], $14::text[], $15::int[], $16::int[], $17::bigint[])"
    " as u(id, run, task, sample, model, policy, seed, trajectory, uri, sha, error, kind, at,"
    " ended, turns, tokens, seq)"
    " on conflict (rollout_id) do nothing returning run_id),"
    " counts as (select run_id, count(*) as n from ins group by run_id)"
    " update runs set generated = runs.generated + counts.n from counts"
    " where runs.run_id = counts.run_id"
)
# Only the first verdict per rollout counts, so a re-scored batch never double-counts; of a
# rollout generated twice, only a verdict of the trajectory kept (the first: its generated_seq).
# An errored rollout has no verdict: it is neither passed nor failed, and adds no score.
# The run's score sum adds each score's exact value (a numeric): a float sum would depend on how
# the verdicts were grouped into batches, and a rebuild would give other rows.
_SCORED_SQL = (
    "with upd as (update rollouts r set score = u.score, passed = u.passed,"
    " primitives = u.primitives::jsonb, error = coalesce(u.error, r.error), scored_at = u.at,"
    " error_kind = coalesce(u.kind, r.error_kind),"
    " status = case when u.outcome = 'errored' then 'errored' else 'scored' end"
    " from unnest($1::text[], $2::text[], $3::float8[], $4::bool[], $5::text[], $6::text[],"
    " $7::text[], $8::text[], $9::timestamptz[], $10::bigint[], $11::numeric[])"
    " as u(id, run, score, passed, primitives, error, outcome, kind, at, judged, exact)"
    " where r.rollout_id = u.id and r.run_id = u.run and r.scored_at is null"
    " and (u.judged is null or r.generated_seq is null or r.generated_seq = u.judged)"
    " returning r.run_id, u.exact, u.outcome),"
    " counts as (select run_id, count(*) as n, count(*) filter (where outcome = 'passed') as p,"
    " count(*) filter (where outcome = 'errored') as e,"
    " coalesce(sum(exact) filter (where outcome <> 'errored'), 0) as s from upd group by run_id)"
    " update runs set scored = runs.scored + counts.n, passed = runs.passed + counts.p,"
    " errored = runs.errored + counts.e, score_sum = runs.score_sum + counts.s from counts"
    " where runs.run_id = counts.run_id"
)


def _generated_row(e: EventEnvelope, p: ev.RolloutsGenerated, r: Any, position: int) -> tuple:
    return (
        r.rollout_id, p.run_id, r.task_index, r.sample_index, r.model, r.policy_version, r.seed,
        None if r.trajectory is None else _json(r.trajectory),
        r.trajectory_uri, r.trajectory_sha256, r.error, r.error_kind, e.time,
        r.ended_by, r.turns, r.completion_tokens, position,
    )  # fmt: skip


def _scored_row(e: EventEnvelope, p: ev.RolloutsScored, r: Any, position: int) -> tuple:
    return (
        r.rollout_id, p.run_id, r.score, r.passed, _json(r.primitives), r.error, r.outcome,
        r.error_kind, e.time, p.generated_seq, Decimal(r.score),
    )  # fmt: skip


async def _flush(c: asyncpg.Connection, batch: RolloutBatch) -> None:
    """A batch of rollout events as at most two statements (each moves its runs' counters)."""
    # Only rollouts seen for the first time count: a re-generated batch never double-counts.
    if rows := batch.generated_rows(_generated_row):
        await c.execute(_GENERATED_SQL, *columns(rows, 17))
    if rows := batch.scored_rows(_scored_row):
        await c.execute(_SCORED_SQL, *columns(rows, 11))


@on("run.completed")
async def _run_completed(c: asyncpg.Connection, e: EventEnvelope, p: ev.RunCompleted) -> None:
    await c.execute(
        f"update runs set status = 'completed', finished_at = $2 where run_id = $1 and {_OPEN}",
        p.run_id, e.time,
    )  # fmt: skip


@on("run.failed")
async def _run_failed(c: asyncpg.Connection, e: EventEnvelope, p: ev.RunFailed) -> None:
    await c.execute(
        "update runs set status = 'failed', reason = $2, finished_at = $3 where run_id = $1"
        f" and {_OPEN}",
        p.run_id, p.reason, e.time,
    )  # fmt: skip


@on("job.requested")
async def _job_requested(c: asyncpg.Connection, e: EventEnvelope, p: ev.JobRequested) -> None:
    await c.execute(
        "insert into jobs(job_id, method, base_model, source_run_id, env_slug, suffix,"
        " hyperparams, status, created_at, updated_at, owner)"
        " values ($1,$2,$3,$4,$5,$6,$7::jsonb,'queued',$8,$8,$9) on conflict do nothing",
        p.job_id, p.method, p.base_model, p.source_run_id, p.env_slug, p.suffix,
        _json(p.hyperparams), e.time, p.owner,
    )  # fmt: skip


@on("job.started")
async def _job_started(c: asyncpg.Connection, e: EventEnvelope, p: ev.JobStarted) -> None:
    # Only a queued job moves: a restarted attempt's start never hides its steps or ending.
    await c.execute(
        "update jobs set status = 'running', updated_at = $2 where job_id = $1"
        " and status = 'queued'",
        p.job_id, e.time,
    )  # fmt: skip


@on("job.progress")
async def _job_progress(c: asyncpg.Connection, e: EventEnvelope, p: ev.JobProgress) -> None:
    await c.execute(
        "update jobs set status = 'running', step = $2, total_steps = $3, loss = $4, reward = $5,"
        f" tokens_per_s = $6, eta_s = $7, updated_at = $8 where job_id = $1 and {_OPEN}",
        p.job_id, p.step, p.total_steps, p.loss, p.reward, p.tokens_per_s, p.eta_s, e.time,
    )  # fmt: skip


@on("job.completed")
async def _job_completed(c: asyncpg.Connection, e: EventEnvelope, p: ev.JobCompleted) -> None:
    await c.execute(
        "update jobs set status = 'completed', model_id = $2, checkpoint_uri = $3,"
        f" updated_at = $4 where job_id = $1 and {_OPEN}",
        p.job_id, p.model_id, p.checkpoint_uri, e.time,
    )  # fmt: skip


@on("job.failed")
async def _job_failed(c: asyncpg.Connection, e: EventEnvelope, p: ev.JobFailed) -> None:
    await c.execute(
        "update jobs set status = 'failed', reason = $2, updated_at = $3 where job_id = $1"
        f" and {_OPEN}",
        p.job_id, p.reason, e.time,
    )  # fmt: skip


@on("checkpoint.saved")
async def _checkpoint(c: asyncpg.Connection, e: EventEnvelope, p: ev.CheckpointSaved) -> None:
    await c.execute(
        "insert into checkpoints(job_id, step, uri, sha256, size_bytes, saved_at)"
        " values ($1,$2,$3,$4,$5,$6) on conflict do nothing",
        p.job_id, p.step, p.uri, p.sha256, p.size_bytes, e.time,
    )  # fmt: skip


@on("policy.updated")
async def _policy(c: asyncpg.Connection, e: EventEnvelope, p: ev.PolicyUpdated) -> None:
    await c.execute(
        "insert into policies(model, version, checkpoint_uri, sha256, job_id, updated_at,"
        " weights_sha256) values ($1,$2,$3,$4,$5,$6,$7) on conflict do nothing",
        p.model, p.version, p.checkpoint_uri, p.sha256, p.job_id, e.time, p.weights_sha256,
    )  # fmt: skip
    if p.signals_uri and p.signals_sha256 and p.trained_rollouts:
        await c.executemany(
            "insert into trained_rollouts(rollout_id, model, version, job_id, signals_uri,"
            " signals_sha256) values ($1,$2,$3,$4,$5,$6) on conflict do nothing",
            [(r, p.model, p.version, p.job_id, p.signals_uri, p.signals_sha256)
             for r in p.trained_rollouts],
        )  # fmt: skip


@on("deadletter.recorded")
async def _dead_letter(c: asyncpg.Connection, e: EventEnvelope, p: ev.DeadLettered) -> None:
    await c.execute(
        "insert into dead_letters(event_id, consumer, stream, stream_seq, subject, deliveries,"
        " reason, recorded_at) values ($1,$2,$3,$4,$5,$6,$7,$8) on conflict do nothing",
        e.id, p.consumer, p.stream, p.stream_seq, p.subject, p.deliveries, p.reason, e.time,
    )  # fmt: skip


class ReadModels:
    """The tracker's projection: environments, runs, rollouts, jobs, policies, dead letters."""

    name = "tracker"
    tables = (
        "environments",
        "env_audits",
        "runs",
        "rollouts",
        "jobs",
        "checkpoints",
        "policies",
        "trained_rollouts",
        "dead_letters",
    )

    async def apply(self, conn: asyncpg.Connection, event: EventEnvelope, position: int) -> None:
        """Apply one event; types without a read model are skipped."""
        await self.apply_batch(conn, [(event, position)])

    async def apply_batch(
        self, conn: asyncpg.Connection, items: list[tuple[EventEnvelope, int]]
    ) -> None:
        """Apply a batch in stream order: runs of rollout events as one statement per type."""
        await apply_events(conn, items, handlers=_HANDLERS, flush=_flush)
