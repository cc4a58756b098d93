"""Run lifecycle: create (validate, append), fan out into work items, complete, time out."""

from __future__ import annotations

import asyncio
import random

import asyncpg
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from nats.js import JetStreamContext, api

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.broker import jetstream
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.contracts.envelope import EventEnvelope, deterministic_id, new_id
from rollout.shared.contracts.events import (
    RunCompleted,
    RunFailed,
    RunRequested,
    RunStarted,
    SamplingParams,
)
from rollout.shared.contracts.requests import CreateRun, Reply
from rollout.shared.contracts.work import RolloutItem, RolloutWork
from rollout.shared.models.openai_compat import check_endpoint_policy
from rollout.shared.models.registry import backend_forms
from rollout.shared.observability import event_context, get_logger
from rollout.shared.store import env_versions

QUEUE = "tracker"
FANOUT_DURABLE = "tracker-fanout"
MAX_N = 10_000
MAX_BATCH = 1_024

log = get_logger(__name__)


def rollout_id(run_id: str, task_index: int, sample_index: int) -> str:
    """Stable id of one rollout of a run."""
    return deterministic_id("rollout", run_id, task_index, sample_index)[:24]


def check_model_name(model: str) -> str | None:
    """A problem with the model name, or None when some backend accepts its form."""
    name = (model or "").strip()
    # A form's prefix may be a whole model name (`local/tiny-agent`) or need a rest (`hf:<dir>`).
    if any(
        name == f.prefix.rstrip("/:") or (name.startswith(f.prefix) and len(name) > len(f.prefix))
        for f in backend_forms()
    ):
        # The operator's endpoint policy: no credential options, no endpoint nobody allowed.
        return check_endpoint_policy(name)
    forms = ", ".join(f"{f.prefix}... (e.g. {f.example})" for f in backend_forms())
    return f"model: unknown model backend {model!r}; valid forms: {forms}"


async def plan_run(js: JetStreamContext, cmd: CreateRun) -> RunRequested:
    """Validate a run request against the registered environment; every problem is listed."""
    problems: list[str] = []
    if cmd.n < 1 or cmd.n > MAX_N:
        problems.append(f"n: must be between 1 and {MAX_N}, got {cmd.n}")
    if not 1 <= cmd.batch_size <= MAX_BATCH:
        problems.append(f"batch_size: must be between 1 and {MAX_BATCH}, got {cmd.batch_size}")
    if cmd.max_tool_calls < 0:
        problems.append(f"max_tool_calls: must be >= 0, got {cmd.max_tool_calls}")
    if not 0 <= cmd.temperature <= 2:
        problems.append(f"temperature: must be between 0 and 2, got {cmd.temperature}")
    if cmd.deadline_s <= 0:
        problems.append(f"deadline_s: must be positive, got {cmd.deadline_s}")
    if (problem := check_model_name(cmd.model)) is not None:
        problems.append(problem)
    # Postgres text cannot hold NUL: such a run would be appended and then never projected.
    for field in ("name", "split", "parent_run_id", "model"):
        value = getattr(cmd, field)
        if isinstance(value, str) and "\x00" in value:
            problems.append(f"{field}: must not contain NUL characters")
    try:
        subjects.token(cmd.env_slug, "environment slug")
    except subjects.SubjectError as exc:
        raise RolloutError(
            "invalid run request", problems=[f"env_slug: {exc}", *problems]
        ) from None
    if cmd.env_version is None:
        env, _ = await env_versions.latest(js, cmd.env_slug)
    else:
        env = await env_versions.version(js, cmd.env_slug, cmd.env_version)
    if env is None:
        what = f"version {cmd.env_version} of " if cmd.env_version else ""
        problems.append(
            f"env_slug: no {what}environment {cmd.env_slug!r} (push it with `rollout push`)"
        )
        raise RolloutError("invalid run request", problems=problems)
    tasks = env.spec.get("tasks", [])
    indices = list(range(len(tasks)))
    if cmd.split is not None:
        indices = [i for i in indices if tasks[i].get("split", "train") == cmd.split]
        if not indices:
            splits = sorted({t.get("split", "train") for t in tasks})
            problems.append(f"split: no tasks in split {cmd.split!r} (splits: {', '.join(splits)})")
    if cmd.task_indices is not None:
        bad = [i for i in cmd.task_indices if i not in indices]
        if bad:
            problems.append(f"task_indices: {bad} not among the selected tasks {indices}")
        indices = [i for i in indices if i in set(cmd.task_indices)]
    if not indices and not problems:
        problems.append(f"environment {cmd.env_slug!r} has no tasks")
    if problems:
        raise RolloutError("invalid run request", problems=problems)
    return RunRequested(
        run_id=new_id()[:16],
        env_slug=env.slug,
        env_version=env.version,
        env_hash=env.spec_hash,
        model=cmd.model,
        n=cmd.n,
        sampling=SamplingParams(
            temperature=cmd.temperature,
            top_p=cmd.top_p,
            max_tokens=cmd.max_tokens,
            seed=cmd.seed,
        ),
        max_tool_calls=cmd.max_tool_calls,
        split=cmd.split,
        name=cmd.name,
        parent_run_id=cmd.parent_run_id,
        task_indices=indices,
        batch_size=cmd.batch_size,
        deadline_s=cmd.deadline_s,
    )


def work_items(event: EventEnvelope, run: RunRequested) -> list[RolloutWork]:
    """Split a run into batches of rollouts; ids are derived, so a retried fan-out dedups."""
    rng = random.Random(run.sampling.seed if run.sampling.seed is not None else run.run_id)
    items = [
        RolloutItem(
            rollout_id=rollout_id(run.run_id, t, s),
            task_index=t,
            sample_index=s,
            seed=rng.randrange(2**31),
        )
        for t in run.task_indices
        for s in range(run.n)
    ]
    batches = [items[i : i + run.batch_size] for i in range(0, len(items), run.batch_size)]
    return [
        RolloutWork(
            work_item_id=deterministic_id("work", run.run_id, index)[:24],
            run_id=run.run_id,
            env_slug=run.env_slug,
            env_version=run.env_version,
            env_hash=run.env_hash,
            model=run.model,
            sampling=run.sampling,
            max_tool_calls=run.max_tool_calls,
            policy_version=run.policy_version,
            items=batch,
            trace_id=event.trace_id,
            correlation_id=event.correlation_id,
            causation_id=event.id,
        )
        for index, batch in enumerate(batches)
    ]


async def fan_out(js: JetStreamContext, event: EventEnvelope) -> RunStarted:
    """Queue a run's work items (many publishes in flight) and mark it started."""
    run = event.body()
    assert isinstance(run, RunRequested)
    batches = work_items(event, run)
    started = RunStarted(
        run_id=run.run_id,
        work_items=len(batches),
        total_rollouts=sum(len(w.items) for w in batches),
    )
    # Started first, so the total is known before any verdict can arrive; a crash between the
    # two publishes retries both, and their derived ids make the retry a no-op where done.
    await EventPublisher(js).publish(
        EventEnvelope.new(started, aggregate_id=run.run_id, id_parts=(run.run_id,), parent=event)
    )
    futures = [
        await js.publish_async(
            subjects.work("rollouts", run.run_id),
            w.model_dump_json().encode(),
            headers={api.Header.MSG_ID: w.work_item_id},
        )
        for w in batches
    ]
    await asyncio.gather(*futures)
    return started


async def requested_event(js: JetStreamContext, run_id: str) -> EventEnvelope:
    """The run's first event: what later lifecycle events carry their trace ids from."""
    raw = await js.get_last_msg(
        subjects.EVENTS_STREAM, subjects.event("run", run_id, subjects.event_name("run.requested"))
    )
    return EventEnvelope.from_bytes(raw.data)


async def complete_if_done(js: JetStreamContext, pool: asyncpg.Pool, run_id: str) -> bool:
    """Emit run.completed once every rollout of a running run is scored."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "select status, total, scored, passed, errored, score_sum from runs where run_id = $1",
            run_id,
        )
    if row is None or row["status"] != "running" or row["scored"] < row["total"]:
        return False
    total = row["total"]
    done = RunCompleted(
        run_id=run_id,
        total=total,
        passed=row["passed"],
        errored=row["errored"],
        pass_rate=row["passed"] / total if total else 0.0,
        mean_score=row["score_sum"] / total if total else 0.0,
    )
    await EventPublisher(js).publish(
        EventEnvelope.new(
            done, aggregate_id=run_id, id_parts=(run_id,), parent=await requested_event(js, run_id)
        )
    )
    log.info("run completed", run_id=run_id, pass_rate=done.pass_rate)
    return True


async def fail_overdue(js: JetStreamContext, pool: asyncpg.Pool) -> list[str]:
    """Fail every unfinished run past its deadline, saying how far it got."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "select run_id, total, scored, deadline_s from runs"
            " where status in ('queued', 'running')"
            " and created_at + make_interval(secs => deadline_s) < now()"
        )
    for row in rows:
        reason = (
            f"deadline of {row['deadline_s']:.0f}s passed with {row['scored']}/{row['total']}"
            " rollouts scored (are actors and verifiers running? see `rollout status`)"
        )
        failed = RunFailed(run_id=row["run_id"], reason=reason)
        await EventPublisher(js).publish(
            EventEnvelope.new(
                failed,
                aggregate_id=row["run_id"],
                id_parts=(row["run_id"],),
                parent=await requested_event(js, row["run_id"]),
            )
        )
        log.warning("run failed", run_id=row["run_id"], reason=reason)
    return [r["run_id"] for r in rows]


def register(broker: NatsBroker) -> None:
    """Attach the run-lifecycle handlers to `broker`."""

    @broker.subscriber(subjects.request("tracker", "create_run"), queue=QUEUE, title="runs/create")
    async def create_run(cmd: CreateRun) -> Reply:
        """Validate and record a run request; the fan-out happens from the event."""
        js = jetstream(broker)
        run = await plan_run(js, cmd)
        event = EventEnvelope.new(
            run, aggregate_id=run.run_id, id_parts=(run.run_id,), run_id=run.run_id
        )
        # A brand-new run id has no history: expecting sequence 0 guards against collisions.
        await EventPublisher(js).publish(event, expected_last_subject_seq=0)
        log.info("run requested", run_id=run.run_id, env=run.env_slug, model=run.model)
        return Reply(data={"runId": run.run_id, **run.model_dump(mode="json")})

    @broker.subscriber(
        subjects.event_filter("run", "run.requested"),
        stream=JStream(subjects.EVENTS_STREAM, declare=False),
        durable=FANOUT_DURABLE,
        pull_sub=PullSub(batch_size=8, timeout=1.0),
        ack_policy=AckPolicy.NACK_ON_ERROR,
        title="runs/fan-out",
    )
    async def on_run_requested(event: EventEnvelope) -> None:
        """Queue a requested run's work items, then mark it started."""
        with event_context(event):
            started = await fan_out(jetstream(broker), event)
            log.info("run fanned out", work_items=started.work_items)
