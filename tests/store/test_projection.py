"""Read models on real Postgres fed from a real events stream: exactly-once and rebuild."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from fractions import Fraction

import asyncpg
import nats.errors
from nats.js import api
from waiting import wait_until

from rollout.services.tracker.main import PROJECTION_DURABLE
from rollout.services.tracker.main import serve as serve_tracker
from rollout.services.tracker.projections import ReadModels
from rollout.services.tracker.queries import _RUN_COLUMNS, run_summary
from rollout.shared import subjects
from rollout.shared.aggregates.run import RunState, rollout_id
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import last_sequence, read_events
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import EventEnvelope, new_id
from rollout.shared.contracts import events as ev
from rollout.shared.replay import ReplayedRun
from rollout.shared.stats import mean_score, score_sum
from rollout.shared.store.db import create_pool, migrate
from rollout.shared.store.projection import ProjectionRunner

DEADLINE_S = 30.0


def run_history(
    run_id: str, *, tasks: int = 3, n: int = 2, scores: list[list[float]] | None = None
) -> list[EventEnvelope]:
    """A plausible run: requested, started, generated and scored batches, completed (sample s
    of task t scored `scores[t][s]`, else s / n)."""
    requested = EventEnvelope.new(
        ev.RunRequested(
            run_id=run_id,
            env_slug="refund-agent",
            env_version=1,
            env_hash="h",
            model="m",
            n=n,
            task_indices=list(range(tasks)),
        ),  # fmt: skip
        aggregate_id=run_id,
        id_parts=(run_id, "req"),
        run_id=run_id,
    )
    out = [requested]
    out.append(
        EventEnvelope.new(
            ev.RunStarted(run_id=run_id, work_items=tasks, total_rollouts=tasks * n),
            aggregate_id=run_id,
            id_parts=(run_id, "start"),
            parent=requested,
        )
    )
    for t in range(tasks):
        ids = [rollout_id(run_id, t, s) for s in range(n)]
        out.append(
            EventEnvelope.new(
                ev.RolloutsGenerated(
                    run_id=run_id,
                    work_item_id=f"w{t}",
                    rollouts=[
                        ev.GeneratedRollout(
                            rollout_id=i, task_index=t, sample_index=s, model="m",
                            trajectory={"messages": [{"role": "user", "content": "hi"}]},
                        )
                        for s, i in enumerate(ids)
                    ],
                ),
                aggregate_id=run_id,
                id_parts=(run_id, "gen", t),
                parent=requested,
            )
        )  # fmt: skip
        out.append(
            EventEnvelope.new(
                ev.RolloutsScored(
                    run_id=run_id,
                    work_item_id=f"w{t}",
                    rollouts=[
                        ev.ScoredRollout(
                            rollout_id=i, task_index=t, sample_index=s,
                            score=scores[t][s] if scores else s / n, passed=s == 0,
                        )
                        for s, i in enumerate(ids)
                    ],
                ),
                aggregate_id=run_id,
                id_parts=(run_id, "score", t),
                parent=requested,
            )
        )  # fmt: skip
    out.append(
        EventEnvelope.new(
            ev.RunCompleted(
                run_id=run_id, total=tasks * n, passed=tasks, pass_rate=0.5, mean_score=0.25
            ),
            aggregate_id=run_id,
            id_parts=(run_id, "done"),
            parent=requested,
        )
    )
    return out


async def snapshot(pool: asyncpg.Pool) -> dict[str, list[tuple]]:
    """Every read-model row, in a stable order."""
    out = {}
    async with pool.acquire() as conn:
        for table in ReadModels.tables:
            rows = await conn.fetch(f"select * from {table}")
            out[table] = sorted(tuple(r.values()) for r in rows)
    return out


async def test_unacked_event_is_redelivered_and_applied_once(nats_client, pg_dsn) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    run_id = new_id()
    history = run_history(run_id, tasks=1, n=4)
    await EventPublisher(js).publish_batch(history)

    pool = await create_pool(pg_dsn)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels())
        sub = await js.pull_subscribe(
            subjects.run_events(run_id),
            stream=subjects.EVENTS_STREAM,
            config=api.ConsumerConfig(ack_wait=1.0, max_deliver=5),
        )
        deliveries: dict[int, int] = {}
        crashed_seq = None
        applied = 0
        # Until every event is acked and the "crashed" one has come back after AckWait.
        while len(deliveries) < len(history) or deliveries.get(crashed_seq) != 2:
            try:
                (msg,) = await sub.fetch(1, timeout=DEADLINE_S)
            except nats.errors.TimeoutError:
                raise AssertionError("expected a redelivery after AckWait") from None
            seq = msg.metadata.sequence.stream
            deliveries[seq] = msg.metadata.num_delivered
            event = EventEnvelope.from_bytes(msg.data)
            applied += await runner.handle(event, seq)
            if event.type == "rollout.scored" and crashed_seq is None:
                crashed_seq = seq  # committed, then "crashed" before the ack: no ack sent
                continue
            await msg.ack()
        assert sorted(deliveries.values()) == [1] * (len(history) - 1) + [2]
        assert applied == len(history)
        async with pool.acquire() as conn:
            run = await conn.fetchrow("select * from runs where run_id = $1", run_id)
        assert (run["scored"], run["passed"], run["status"]) == (4, 1, "completed")
        assert run["score_sum"] == 0 + 0.25 + 0.5 + 0.75
    finally:
        await pool.close()


async def test_tracker_projects_everything_and_rebuild_gives_identical_rows(
    settings, nats_client, pg_dsn
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    for _ in range(2):
        await EventPublisher(js).publish_batch(run_history(new_id()))
    job = new_id()
    await EventPublisher(js).publish_batch(
        [
            EventEnvelope.new(
                ev.JobRequested(job_id=job, method="sft", base_model="hf:tiny"),
                aggregate_id=job,
                id_parts=(job, 0),
            ),
            EventEnvelope.new(
                ev.JobProgress(job_id=job, step=3, total_steps=10, loss=1.5),
                aggregate_id=job,
                id_parts=(job, 1),
            ),
        ]
    )
    # A poison event on the log: dead-lettered by the tracker, skipped by the rebuild.
    await js.publish(subjects.event("run", new_id(), "run_failed"), b"{oops")

    task = asyncio.create_task(serve_tracker(settings.with_database(pg_dsn)))
    pool = await create_pool(pg_dsn)
    try:
        await wait_position_or_crash(task, pool, js)
        before = await snapshot(pool)
        assert len(before["runs"]) >= 2 and len(before["rollouts"]) >= 12
        assert any(r[0] == job for r in before["jobs"])
        assert len(before["dead_letters"]) >= 1

        applied = await ProjectionRunner(pool, ReadModels()).rebuild(js)
        assert applied >= 15
        after = await snapshot(pool)
        assert after == before
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()


async def wait_position_or_crash(task: asyncio.Task, pool: asyncpg.Pool, js) -> None:
    """Wait until the tracker has projected the whole log (dead letters included)."""
    runner = ProjectionRunner(pool, ReadModels())
    seen: dict[str, int] = {}

    async def caught_up() -> bool:
        if task.done():
            task.result()
        seen["target"] = await last_sequence(js)
        try:
            seen["position"] = await runner.position()
        except asyncpg.UndefinedTableError:
            seen["position"] = 0
        if seen["position"] < seen["target"]:
            return False
        # The dead-letter event lands after the poison one; wait for it too.
        async with pool.acquire() as conn:
            return bool(await conn.fetchval("select count(*) from dead_letters"))

    try:
        await wait_until(caught_up, "the tracker to project the whole log", DEADLINE_S)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: tracker at {seen.get('position')}, log at {seen.get('target')}"
        ) from None


async def test_a_second_verdict_for_the_same_rollouts_never_double_counts(pg_dsn) -> None:
    run_id = new_id()
    history = run_history(run_id, tasks=1, n=3)
    scored = next(e for e in history if e.type == "rollout.scored")
    rescored = EventEnvelope.new(
        scored.body(), aggregate_id=run_id, id_parts=(run_id, "score-again"), parent=scored
    )
    pool = await create_pool(pg_dsn)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels())
        for position, event in enumerate([*history, rescored], start=1):
            assert await runner.handle(event, position)
        async with pool.acquire() as conn:
            run = await conn.fetchrow("select * from runs where run_id = $1", run_id)
        assert (run["generated"], run["scored"], run["passed"]) == (3, 3, 1)
    finally:
        await pool.close()


async def test_model_output_with_nul_characters_does_not_stall_the_read_models(pg_dsn) -> None:
    run_id = new_id()
    history = run_history(run_id, tasks=1, n=1)
    generated = next(e for e in history if e.type == "rollout.generated")
    body = generated.body()
    body.rollouts[0].trajectory = {"final_output": "odd\x00bytes", "note": "keep \\u0000 literal"}
    poisoned = EventEnvelope.new(body, aggregate_id=run_id, id_parts=(run_id, "nul"), run_id=run_id)
    history = [poisoned if e.type == "rollout.generated" else e for e in history]
    pool = await create_pool(pg_dsn)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels())
        assert await runner.handle_batch([(e, i) for i, e in enumerate(history, start=1)]) == len(
            history
        )
        async with pool.acquire() as conn:
            stored = await conn.fetchval("select trajectory->>'final_output' from rollouts")
            literal = await conn.fetchval("select trajectory->>'note' from rollouts")
        assert stored == "oddbytes" and literal == "keep \\u0000 literal"
    finally:
        await pool.close()


def _as_version(event: EventEnvelope, version: str, **extra_payload: object) -> bytes:
    data = event.model_dump(mode="json")
    data["schema_version"] = version
    data["payload"] = {**data["payload"], **extra_payload}
    return json.dumps(data).encode()


async def test_tracker_reads_a_newer_minor_and_dead_letters_a_new_major(
    settings, nats_client, pg_dsn
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    minor, major, after = new_id(), new_id(), new_id()
    minor_req, major_req, after_req = (
        run_history(r, tasks=1, n=1)[0] for r in (minor, major, after)
    )
    await js.publish(minor_req.subject, _as_version(minor_req, "1.3", priority="high"))
    await js.publish(major_req.subject, _as_version(major_req, "2.0"))
    await EventPublisher(js).publish(after_req)

    task = asyncio.create_task(serve_tracker(settings.with_database(pg_dsn)))
    pool = await create_pool(pg_dsn)
    try:
        await wait_position_or_crash(task, pool, js)
        async with pool.acquire() as conn:
            runs = {r["run_id"] for r in await conn.fetch("select run_id from runs")}
            # The fan-out consumer reads run.requested too and may give up on it as well.
            rows = await conn.fetch(
                "select reason from dead_letters where consumer = $1", PROJECTION_DURABLE
            )
            reasons = [r["reason"] for r in rows]
        assert runs == {minor, after}
        assert len(reasons) == 1
        assert reasons[0].startswith("unsupported schema version 2.0 of run.requested event")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()


async def test_a_lifecycle_event_never_moves_an_ended_run_or_job_back(pg_dsn) -> None:
    run_id, job = new_id(), new_id()
    history = run_history(run_id, tasks=1, n=1)
    requested = history[0]
    late = [
        ev.RunFailed(run_id=run_id, reason="deadline"),
        ev.RunStarted(run_id=run_id, work_items=1, total_rollouts=1),
    ]
    job_events = [
        ev.JobRequested(job_id=job, method="sft", base_model="hf:tiny"),
        ev.JobCompleted(job_id=job, model_id="ft:x"),
        ev.JobFailed(job_id=job, reason="late"),
        ev.JobProgress(job_id=job, step=9, total_steps=10),
    ]
    events = [
        *history,
        *(
            EventEnvelope.new(
                p, aggregate_id=run_id, id_parts=(run_id, "late", i), parent=requested
            )
            for i, p in enumerate(late)
        ),
        *(
            EventEnvelope.new(p, aggregate_id=job, id_parts=(job, i))
            for i, p in enumerate(job_events)
        ),
    ]
    pool = await create_pool(pg_dsn)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels())
        assert await runner.handle_batch([(e, i) for i, e in enumerate(events, start=1)]) == len(
            events
        )
        async with pool.acquire() as conn:
            run = await conn.fetchrow("select * from runs where run_id = $1", run_id)
            row = await conn.fetchrow("select * from jobs where job_id = $1", job)
        assert (run["status"], run["reason"]) == ("completed", None)
        assert (row["status"], row["reason"], row["model_id"], row["step"]) == (
            "completed", None, "ft:x", 0,
        )  # fmt: skip
    finally:
        await pool.close()


def _tricky_history(run_a: str, run_b: str) -> list[EventEnvelope]:
    """Two interleaved runs with every case a grouped batch must keep in stream order."""
    a, b = run_history(run_a, tasks=3, n=2), run_history(run_b, tasks=2, n=2)
    gen_a = [e for e in a if e.type == "rollout.generated"]
    scored_a = [e for e in a if e.type == "rollout.scored"]
    requested = a[0]
    # A verdict that arrives before its rollout (it must find nothing), then a re-generation
    # of an already generated batch, and a second verdict with other scores (first one wins).
    early = EventEnvelope.new(
        scored_a[2].body(), aggregate_id=run_a, id_parts=(run_a, "early"), parent=requested
    )
    regen = EventEnvelope.new(
        gen_a[0].body(), aggregate_id=run_a, id_parts=(run_a, "regen"), parent=requested
    )
    other = scored_a[0].body().model_copy(deep=True)
    for r in other.rollouts:
        r.score, r.passed = 0.99, True
    rescored = EventEnvelope.new(
        other, aggregate_id=run_a, id_parts=(run_a, "rescore"), parent=requested
    )
    errored = b[5].body().model_copy(deep=True)
    errored.rollouts[0].outcome, errored.rollouts[0].error = "errored", "sandbox died"
    errored.rollouts[0].error_kind = "infra"
    errored_event = EventEnvelope.new(
        errored, aggregate_id=run_b, id_parts=(run_b, "errored"), parent=b[0]
    )
    b = [errored_event if e is b[5] else e for e in b]
    return [
        a[0], b[0], a[1], b[1], early, gen_a[0], b[2], scored_a[0], rescored, regen, b[3],
        gen_a[1], gen_a[2], scored_a[1], scored_a[2], b[4], b[5], a[-1], b[-1],
    ]  # fmt: skip


async def test_a_batch_applies_as_one_statement_per_type_and_equals_one_by_one(pg_dsn) -> None:
    history = _tricky_history(new_id(), new_id())
    items = list(enumerate(history, start=1))
    statements: list[str] = []

    async def count(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: statements.append(record.query))

    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1, init=count)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels(), contiguous=True)
        for position, event in items:
            assert await runner.handle(event, position)
        one_by_one = await snapshot(pool)
        async with pool.acquire() as conn:
            await conn.execute(f"truncate {', '.join(ReadModels.tables)}")
            await conn.execute("update projection_tracking set position = 0")
        statements.clear()
        assert await runner.handle_batch([(e, p) for p, e in items]) == len(items)
        applying = list(statements)
        batched = await snapshot(pool)
        # A redelivered batch changes nothing.
        assert await runner.handle_batch([(e, p) for p, e in items]) == len(items)
        assert await snapshot(pool) == batched
    finally:
        await pool.close()
    assert batched == one_by_one
    runs = {row[0]: row for row in batched["runs"]}
    assert len(runs) == 2
    # 19 events, yet only the lifecycle events and a few grouped statements: one per event
    # would be at least 30 here (two per rollout event).
    rollout_statements = [q for q in applying if "unnest" in q]
    assert len(rollout_statements) <= 6, rollout_statements
    assert len(applying) <= 16, applying


def twice_generated(run_id: str, start: int = 0) -> tuple[list[EventEnvelope], list[EventEnvelope]]:
    """A rollout generated twice (a replica presumed dead that was not): its first trajectory
    fails, the second passes; (the history to both generated events, each copy's verdict),
    the history to be applied from stream position `start` + 1."""
    history = run_history(run_id, tasks=1, n=1)
    requested, started, first = history[0], history[1], history[2]
    body = first.body()
    second = body.model_copy(deep=True)
    second.rollouts[0].trajectory = {"final_output": "the second copy"}
    body.rollouts[0].trajectory = {"final_output": "the first copy"}
    copies = [
        EventEnvelope.new(b, aggregate_id=run_id, id_parts=(run_id, tag), run_id=run_id)
        for b, tag in ((body, "first"), (second, "zombie"))
    ]
    verdicts = []
    for position, passed in ((start + 3, False), (start + 4, True)):
        rollout = ev.ScoredRollout(
            rollout_id=rollout_id(run_id, 0, 0), task_index=0, sample_index=0, score=float(passed),
            passed=passed,
        )  # fmt: skip
        scored = ev.RolloutsScored(
            run_id=run_id, work_item_id="w0", rollouts=[rollout], generated_seq=position
        )
        verdicts.append(
            EventEnvelope.new(
                scored, aggregate_id=run_id, id_parts=(run_id, position), run_id=run_id
            )  # fmt: skip
        )
    return [requested, started, *copies], verdicts


async def test_a_rollout_generated_twice_keeps_its_first_trajectory_with_that_ones_verdict(
    pg_dsn,
) -> None:
    pool = await create_pool(pg_dsn)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels(), contiguous=True)
        for batched in (False, True):
            run_id = new_id()
            async with pool.acquire() as conn:
                start = await conn.fetchval("select position from projection_tracking") or 0
            history, (first_verdict, second_verdict) = twice_generated(run_id, start)
            # The second copy's verdict lands first (the verifier's replicas race).
            events = [*history, second_verdict, first_verdict]
            items = [(e, start + i) for i, e in enumerate(events, start=1)]
            if batched:
                assert await runner.handle_batch(items) == len(items)
            else:
                for event, position in items:
                    assert await runner.handle(event, position)
            async with pool.acquire() as conn:
                row = await conn.fetchrow("select * from rollouts where run_id = $1", run_id)
                run = await conn.fetchrow("select * from runs where run_id = $1", run_id)
            assert json.loads(row["trajectory"]) == {"final_output": "the first copy"}
            # The verdict of the trajectory kept, never the other copy's pass.
            assert row["passed"] is False and row["status"] == "scored", batched
            assert (run["generated"], run["scored"], run["passed"]) == (1, 1, 0), batched
    finally:
        await pool.close()


async def test_an_event_the_read_models_cannot_hold_is_skipped_alone_not_retried_forever(
    pg_dsn,
) -> None:
    # A run.requested whose max_tool_calls overflows its column (as one recorded before the
    # contract bounded it could): the batch fails as a whole every time. Event by event, the
    # runs around it are projected and it alone only moves the position.
    good, bad = new_id(), new_id()
    history = run_history(good, tasks=1, n=1)
    payload = history[0].body().model_copy(update={"run_id": bad, "max_tool_calls": 2**40})
    poisoned = EventEnvelope.new(payload, aggregate_id=bad, id_parts=(bad, "req"), run_id=bad)
    items = [(history[0], 1), (poisoned, 2), *[(e, i) for i, e in enumerate(history[1:], 3)]]
    pool = await create_pool(pg_dsn)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels())
        try:
            await runner.handle_batch(items)
        except asyncpg.exceptions.DataError:
            pass
        else:
            raise AssertionError("the poisoned batch applied as a whole")
        assert await runner.handle_each(items) == len(items)
        assert await runner.position() == len(items)
        async with pool.acquire() as conn:
            runs = {r["run_id"]: r["status"] for r in await conn.fetch("select * from runs")}
        assert runs == {good: "completed"}
    finally:
        await pool.close()


async def test_a_runs_mean_score_is_the_same_however_its_verdicts_were_batched(pg_dsn) -> None:
    # The live projection applies whatever batch its consumer fetched, a rebuild one event at a
    # time: a float sum of the scores depends on that grouping, so `rollout show` gave another
    # meanScore after `rollout admin rebuild` (0.19999999999999987, then ...62), and `rollout
    # replay` a third (...0143). The sum is exact now: every grouping gives the same row, and
    # the read model, replay and the run's completion agree on the mean.
    run_id = new_id()
    scores = [[0.1, 0.8], [0.8, 0.3], [0.5, 0.4], [0.7, 0.8]]
    history = run_history(run_id, tasks=4, n=2, scores=scores)
    items = list(enumerate(history, start=1))
    pool = await create_pool(pg_dsn)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels(), contiguous=True)
        for position, event in items:
            assert await runner.handle(event, position)
        one_by_one = await snapshot(pool)
        async with pool.acquire() as conn:
            await conn.execute(f"truncate {', '.join(ReadModels.tables)}")
            await conn.execute("update projection_tracking set position = 0")
        assert await runner.handle_batch([(e, p) for p, e in items]) == len(items)
        batched = await snapshot(pool)
        async with pool.acquire() as conn:
            row = await conn.fetchrow(f"select {_RUN_COLUMNS} from runs where run_id = $1", run_id)
    finally:
        await pool.close()
    assert batched == one_by_one
    shown = run_summary(row)["meanScore"]
    replayed = ReplayedRun(request=history[0].body())
    for event in history:
        body = event.body()
        if isinstance(body, ev.RolloutsScored):
            replayed.scored.update({r.rollout_id: r for r in body.rollouts})
    assert (
        shown == replayed.summary()["meanScore"] == float(sum(map(Fraction, sum(scores, []))) / 8)
    )
    # The exact mean, rounded once: a run of 0.2s has the mean 0.2 (a float sum gave ...0143).
    assert mean_score(score_sum([0.2] * 384), 384) == 0.2
    run = RunState(run_id)
    for position, event in items[:-1]:  # to its last verdict: the run decides its completion
        run.apply(event, position)
    completed = run.decide(datetime.now(UTC))
    assert isinstance(completed, ev.RunCompleted) and completed.mean_score == shown


async def test_a_rebuild_skips_an_event_the_read_models_cannot_hold_as_the_live_projection_does(
    nats_client, pg_dsn
) -> None:
    # The live projection skips such an event alone (above); `rollout admin rebuild` stopped at
    # it with a traceback and rebuilt nothing, so a log holding one could never be rebuilt.
    js = nats_client.jetstream()
    await ensure_streams(js)
    good, bad, after = new_id(), new_id(), new_id()
    poisoned_request = run_history(bad, tasks=1, n=1)[0].body()
    poisoned = EventEnvelope.new(
        poisoned_request.model_copy(update={"max_tool_calls": 2**40}),
        aggregate_id=bad,
        id_parts=(bad, "req"),
        run_id=bad,
    )
    await EventPublisher(js).publish_batch([*run_history(good), poisoned, *run_history(after)])
    pool = await create_pool(pg_dsn)
    try:
        await migrate(pool)
        runner = ProjectionRunner(pool, ReadModels())
        items = []
        async for msg in read_events(js, subjects.ALL_EVENTS):
            items.append((EventEnvelope.from_bytes(msg.data), msg.metadata.sequence.stream))
        assert await runner.handle_each(items) == len(items)
        live = await snapshot(pool)
        assert {row[0] for row in live["runs"]} == {good, after}

        applied = await runner.rebuild(js)
        assert applied == len(items) - 1
        assert await snapshot(pool) == live
        assert await runner.position() == items[-1][1]
    finally:
        await pool.close()
