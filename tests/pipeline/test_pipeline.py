"""The whole loop on real NATS and Postgres: push, run, actors, verifier, tracker, queries."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from pipeline.kit import refund_env, snapshot
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.services.tracker.projections import ReadModels
from rollout.services.tracker.servable import TIMEOUT_ENV
from rollout.shared import subjects
from rollout.shared.bus.reader import last_sequence
from rollout.shared.contracts import requests as rq
from rollout.shared.models import trained
from rollout.shared.objectstore import LocalObjectStore
from rollout.shared.settings import connect_nats
from rollout.shared.store.projection import ProjectionRunner


async def test_push_versions_by_content(client) -> None:
    first = await client.push_environment(refund_env())
    assert (first["version"], first["created"]) == (1, True)
    again = await client.push_environment(refund_env())
    assert (again["version"], again["created"], again["spec_hash"]) == (
        1,
        False,
        first["spec_hash"],
    )
    changed = refund_env()
    changed["description"] = "now with a description"
    second = await client.push_environment(changed)
    assert (second["version"], second["created"]) == (2, True)
    assert second["spec_hash"] != first["spec_hash"]
    old = await client.get_environment("refunds", 1)
    assert old["spec_hash"] == first["spec_hash"] and old["spec"]["slug"] == "refunds"
    listed = await client.list_environments()
    assert [(e["slug"], e["version"]) for e in listed] == [("refunds", 2)]


async def test_invalid_environment_is_refused_with_every_problem(client) -> None:
    bad = refund_env()
    bad["config"]["tools"][0]["fixturePath"] = "orderz.${args.order_id}"
    bad["verifier"] = {"primitives": [{"name": "x", "type": "no_such_primitive"}]}
    with pytest.raises(RolloutError) as caught:
        await client.push_environment(bad)
    text = str(caught.value)
    assert "orderz" in text and "no_such_primitive" in text
    assert await client.list_environments() == []


async def test_run_completes_with_exactly_tasks_times_n_rollouts(
    client, agent_server, settings
) -> None:
    await client.push_environment(refund_env(tasks=3))
    run = await client.create_run(
        "refunds", f"{agent_server.base_url}#scripted", n=8, batch_size=5, temperature=0.0
    )
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["status"] == "completed", done
    assert (done["total"], done["scored"], done["generated"]) == (24, 24, 24)
    full = await client.get_run(run["runId"], include_rollouts=True)
    rollouts = full["rollouts"]
    assert len({r["rolloutId"] for r in rollouts}) == 24
    assert sorted({(r["taskIndex"], r["sampleIndex"]) for r in rollouts}) == [
        (t, s) for t in range(3) for s in range(8)
    ]
    # The scripted agent is wrong exactly when its seed is divisible by 4.
    for r in rollouts:
        assert r["passed"] == (r["seed"] % 4 != 0), r
    assert done["passed"] == sum(r["seed"] % 4 != 0 for r in rollouts)
    assert [t["n"] for t in full["tasks"]] == [8, 8, 8]
    ids = await client.passing_rollout_ids(run["runId"])
    assert len(ids) == done["passed"]
    # One trace from request to completion; each event names the one that caused it.
    nc = await connect_nats(settings)
    try:
        from rollout.shared.bus.reader import read_events
        from rollout.shared.contracts import EventEnvelope

        read = [m async for m in read_events(nc.jetstream(), subjects.run_events(run["runId"]))]
    finally:
        await nc.close()
    events = [EventEnvelope.from_bytes(m.data) for m in read]
    positions = {e.id: m.metadata.sequence.stream for e, m in zip(events, read, strict=True)}
    requested = events[0]
    assert requested.type == "run.requested" and events[-1].type == "run.completed"
    assert {e.trace_id for e in events} == {requested.trace_id}
    assert {e.run_id for e in events} == {run["runId"]}
    assert all(e.causation_id for e in events[1:])
    ids_seen = {e.id for e in events}
    scored = [e for e in events if e.type == "rollout.scored"]
    assert all(e.causation_id in ids_seen for e in scored)
    # Each verdict names where the trajectories it judged are on the log.
    assert all(e.body().generated_seq == positions[e.causation_id] for e in scored)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"env_slug": "nope", "model": "openai/gpt-4o-mini"}, "no environment 'nope'"),
        ({"env_slug": "refunds", "model": "magic/model"}, "unknown model backend 'magic/model'"),
        # Names that can only be trained policies must have been published.
        (
            {"env_slug": "refunds", "model": "local/tiny-agent:typo"},
            "model: no trained model 'local/tiny-agent:typo' (see `rollout jobs`",
        ),
        (
            {"env_slug": "refunds", "model": "job-0123456789abcdef"},
            "model: no training job 'job-0123456789abcdef'",
        ),
        ({"env_slug": "refunds", "model": "job-../../x"}, "model: 'job-../../x' is not a job id"),
        (
            {"env_slug": "refunds", "model": "job-0123456789abcdef:typo"},
            "model: no trained model 'job-0123456789abcdef:typo'",
        ),
        ({"env_slug": "refunds", "model": "openai/gpt-4o-mini", "n": 0}, "n: must be between"),
        ({"env_slug": "refunds", "model": "openai/x", "split": "dev"}, "no tasks in split 'dev'"),
        ({"env_slug": "bad slug!", "model": "openai/x"}, "env_slug"),
        # 12 tasks x 10,000: each number in range, the run too big (a typo'd -n).
        ({"env_slug": "refunds", "model": "openai/x", "n": 10_000}, "= 120,000 rollouts, over"),
    ],
)
async def test_bad_run_requests_are_refused_before_anything_is_queued(
    client, settings, options, expected
) -> None:
    await client.push_environment(refund_env(tasks=12))
    with pytest.raises(RolloutError) as caught:
        await client.create_run(**options)
    assert expected in str(caught.value)
    assert await client.list_runs() == []
    nc = await connect_nats(settings)
    try:
        info = await nc.jetstream().stream_info(subjects.WORK_STREAM)
        assert info.state.messages == 0
    finally:
        await nc.close()


async def test_a_published_trained_name_is_accepted(client, settings, monkeypatch) -> None:
    # The tracker's own check of the name; the actors, asked, would refuse these records
    # (their weights are nowhere): their check is off here (test_model_check.py has it).
    monkeypatch.setenv(TIMEOUT_ENV, "0")
    await client.push_environment(refund_env(tasks=2))
    store = LocalObjectStore(settings.home / "objects")
    record = trained.PolicyRecord(
        model="local/tiny-agent:mine",
        version=0,
        uri="file:///nowhere",
        job_id="job-00000000000000aa",
    )
    await trained.publish_record(store, record)
    # Trained from that job's model: named after its base, the job id.
    again = trained.PolicyRecord(model="job-00000000000000aa:more", version=0, uri="file:///x")
    await trained.publish_record(store, again)
    for name in ("local/tiny-agent:mine", "job-00000000000000aa", "job-00000000000000aa:more"):
        run = await client.create_run("refunds", name, task_indices=[0])
        assert run["model"] == name
        # Its weights are nowhere: stopped before an actor spends time on them (or ended,
        # every rollout errored for that, if the actor got there first).
        try:
            await client.cancel_run(run["runId"], reason="test")
        except RolloutError as exc:
            assert "already" in str(exc), exc


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"n": 0}, "n: must be between"),
        ({"temperature": 99.0}, "temperature: must be between 0 and 2"),
        ({"batch_size": 0}, "batch_size: must be between"),
        ({"deadline_s": -1.0}, "deadline_s: must be a positive number"),
        ({"max_tokens": 0}, "max_tokens: must be between 1 and"),
    ],
)
async def test_out_of_range_options_are_refused_by_the_client_and_by_the_tracker(
    client, settings, options, expected
) -> None:
    await client.push_environment(refund_env())
    with pytest.raises(RolloutError) as caught:  # the CLI's client: before anything is sent
        await client.create_run("refunds", "openai/gpt-4o-mini", **options)
    assert expected in str(caught.value)
    # A client that skips that check (a hostile key holder) meets the same rule at the tracker.
    body = rq.CreateRun(env_slug="refunds", model="openai/gpt-4o-mini", **options)
    with pytest.raises(RolloutError) as caught:
        await client.request("tracker", "create_run", body)
    assert expected in str(caught.value)
    assert await client.list_runs() == []


async def test_run_without_actors_fails_at_its_deadline_with_a_reason(
    client, platform, agent_server, settings
) -> None:
    await platform.stop("actor-1")
    await platform.stop("actor-2")
    await client.push_environment(refund_env(tasks=1))
    run = await client.create_run("refunds", f"{agent_server.base_url}#m", n=2, deadline_s=1.0)
    done = await client.wait_for_run(run["runId"], timeout_s=60)
    assert done["status"] == "failed"
    assert "deadline of 1s passed with 0/2 rollouts scored" in done["reason"]


async def test_read_models_equal_a_rebuild_after_a_run(client, agent_server, settings) -> None:
    await client.push_environment(refund_env(tasks=2))
    run = await client.create_run("refunds", f"{agent_server.base_url}#m", n=3)
    await client.wait_for_run(run["runId"], timeout_s=120)
    pool = await asyncpg.create_pool(settings.database_url)
    nc = await connect_nats(settings)
    try:
        runner = ProjectionRunner(pool, ReadModels())
        js = nc.jetstream()
        target = await last_sequence(js)

        async def caught_up() -> bool:
            return await runner.position() >= target

        await wait_until(caught_up, "the tracker to project the whole log")
        before = await snapshot(pool)
        await runner.rebuild(js)
        assert await snapshot(pool) == before
    finally:
        await nc.close()
        await pool.close()


async def test_replay_reproduces_every_score_and_reverify_lists_changes(
    client, agent_server, settings
) -> None:
    from rollout.shared.replay import replay_run, reverify
    from rollout.shared.store.trajectories import object_store

    await client.push_environment(refund_env(tasks=2))
    run = await client.create_run("refunds", f"{agent_server.base_url}#m", n=4)
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    recorded = {
        r["rolloutId"]: r["score"]
        for r in (await client.get_run(run["runId"], include_rollouts=True))["rollouts"]
    }
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        replayed = await replay_run(js, run["runId"])
        summary = replayed.summary()
        for key in ("status", "total", "scored", "passed", "errored"):
            assert summary[key] == done[key], key
        assert summary["meanScore"] == pytest.approx(done["meanScore"])
        # Each trajectory is stored once, in the object store: re-verifying reads it there.
        with pytest.raises(RolloutError, match="re-verifying needs the object store"):
            await reverify(js, replayed)
        store = object_store(settings)
        version, rows = await reverify(js, replayed, store=store)
        assert version == 1 and len(rows) == 8
        assert [r for r in rows if r["changed"]] == []
        assert {r["rolloutId"]: r["score"] for r in rows} == pytest.approx(recorded)

        # Today's verifier also wants the agent to say "sorry": every rollout that scored
        # anything now scores less; those that scored 0 still do.
        stricter = refund_env(tasks=2)
        stricter["verifier"] = [
            {"name": "refunded", "type": "state_match", "weight": 1},
            {"name": "apologised", "type": "contains_terms", "terms": ["sorry"], "weight": 1},
        ]
        await client.push_environment(stricter)
        version, rows = await reverify(js, replayed, store=store)
        assert version == 2
        changed = {r["rolloutId"] for r in rows if r["changed"]}
        assert changed == {rollout for rollout, score in recorded.items() if score > 0}
        assert changed
        assert all(not r["passed"] for r in rows)
        assert any("sorry" in reason for r in rows for reason in r["reasons"])

        # Today's version lists a new task first: each trajectory is scored against its own
        # task, found where it now stands (by index it was task 0's against the new one's
        # ground truth, and task 1's against task 0's: 8 false changes).
        reordered = refund_env(tasks=3)
        reordered["tasks"] = [reordered["tasks"][2], *reordered["tasks"][:2]]
        await client.push_environment(reordered)
        version, rows = await reverify(js, replayed, store=store)
        assert version == 3 and len(rows) == 8
        assert [r for r in rows if r["changed"]] == []
        assert [r["taskIndex"] for r in rows] == [0] * 4 + [1] * 4  # the run's own indices
        # A version without a task the run used is refused, naming it, not scored by index.
        await client.push_environment(refund_env(tasks=3) | {"tasks": reordered["tasks"][:2]})
        with pytest.raises(RolloutError) as err:
            await reverify(js, replayed, store=store)
        assert str(err.value) == (
            "environment 'refunds' v4 lacks 1 task(s) the run used, first task 1 of v1 "
            "('Refund order O-1 in full'): re-verify against its own version with "
            "--env-version 1"
        )
    finally:
        await nc.close()


async def test_large_trajectories_travel_by_claim_check(
    client, agent_server, settings, monkeypatch
) -> None:
    from rollout.shared.replay import replay_run, reverify
    from rollout.shared.store.trajectories import INLINE_LIMIT_ENV, object_store

    # Every trajectory counts as large: all of them go to the object store.
    monkeypatch.setenv(INLINE_LIMIT_ENV, "10")
    await client.push_environment(refund_env(tasks=2))
    run = await client.create_run("refunds", f"{agent_server.base_url}#m", n=2)
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    full = await client.get_run(run["runId"], include_rollouts=True, include_trajectories=True)
    assert done["scored"] == 4
    for r in full["rollouts"]:
        assert r["trajectoryUri"].startswith("file://") and len(r["trajectorySha256"]) == 64
        assert r["trajectory"]["final_state"]["refunds"]  # fetched back and verified
        assert r["passed"] == (r["seed"] % 4 != 0)
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        replayed = await replay_run(js, run["runId"])
        assert all(g.trajectory is None for g in replayed.generated.values())
        async with object_store(settings) as store:
            _, rows = await reverify(js, replayed, store=store)
        assert len(rows) == 4 and not any(r["changed"] for r in rows)
    finally:
        await nc.close()


async def test_the_synchronous_client_reads_like_the_seed_readme(
    client, agent_server, settings
) -> None:
    from rollout import Client

    await client.push_environment(refund_env(tasks=2))

    def seed_example() -> tuple[dict, list[str], dict]:
        c = Client(settings=settings)
        try:
            run = c.create_run(env_slug="refunds", model=f"{agent_server.base_url}#m", n=4)
            done = c.wait_for_run(run["runId"], timeout_s=120)
            ids = c.passing_rollout_ids(run["runId"])
            return done, ids, c.get_run(run["runId"], include_rollouts=True)
        finally:
            c.close()

    done, ids, full = await asyncio.to_thread(seed_example)
    assert done["status"] == "completed" and done["scored"] == 8
    assert sorted(ids) == sorted(r["rolloutId"] for r in full["rollouts"] if r["passed"])
    assert len(ids) == done["passed"]
