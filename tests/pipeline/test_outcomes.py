"""Typed outcomes: a platform failure is retried, then errored with its cause, never a verdict."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from fakes.openai_server import FakeOpenAI
from pipeline.kit import Platform, fix_env, fixer, refund_env, wait_for_platform
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.services.actor.generate import failed_batch
from rollout.services.tracker.runs import work_items
from rollout.services.tracker.servable import TIMEOUT_ENV
from rollout.services.verifier.main import ACK_WAIT_ENV, DURABLE
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts.events import RolloutsGenerated, RunRequested
from rollout.shared.envs.sandbox import BWRAP_ENV_VAR
from rollout.shared.objectstore.factory import OBJECT_STORE_ENV
from rollout.shared.replay import replay_run
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.store import env_versions
from rollout.shared.store.trajectories import INLINE_LIMIT_ENV


async def verifier_deliveries(settings: Settings) -> int:
    """How many deliveries the verifier's consumer has made (redeliveries included)."""
    nc = await connect_nats(settings)
    try:
        info = await nc.jetstream().consumer_info(subjects.EVENTS_STREAM, DURABLE)
    finally:
        await nc.close()
    return info.delivered.consumer_seq


async def run_events(settings: Settings, run_id: str, event_type: str) -> list[EventEnvelope]:
    """Every event of `event_type` on the run's subject."""
    nc = await connect_nats(settings)
    try:
        return [
            e
            async for msg in read_events(nc.jetstream(), subjects.run_events(run_id))
            if (e := EventEnvelope.from_bytes(msg.data)).type == event_type
        ]
    finally:
        await nc.close()


def assert_errored(run: dict[str, Any], kind: str, *causes: str) -> None:
    """Every rollout errored (no verdict) with `kind` and a cause naming each of `causes`;
    the run, having measured nothing, failed saying so with the first rollout's error."""
    assert run["status"] == "failed", run
    total = run["total"]
    assert run["reason"].startswith(f"every rollout errored ({total} of {total}), so nothing"
                                    f" was measured; the first: task "), run["reason"]  # fmt: skip
    assert f"({kind} error): " in run["reason"], run["reason"]
    assert run["errored"] == run["total"] and run["passed"] == 0 and run["failed"] == 0
    assert run["passRate"] == 0.0 and run["meanScore"] == 0.0
    for r in run["rollouts"]:
        assert r["outcome"] == "errored" and r["status"] == "errored", r
        assert r["errorKind"] == kind, r
        assert r["passed"] is False
        for cause in causes:
            assert cause in r["error"], r["error"]


async def test_sandbox_unavailable_is_retried_then_errored_with_its_cause(
    client, settings, monkeypatch, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-bwrap"
    monkeypatch.setenv(BWRAP_ENV_VAR, str(missing))
    await client.push_environment(fix_env())
    with FakeOpenAI(fixer) as server:
        run = await client.create_run("fix-add", f"{server.base_url}#m", n=2)
        done = await client.wait_for_run(run["runId"], timeout_s=120)
    full = await client.get_run(run["runId"], include_rollouts=True)
    assert_errored(full, "infra", str(missing), "after 5 attempts")
    assert done["errored"] == 2
    # One generated batch, delivered to the verifier five times before it gave up.
    assert await verifier_deliveries(settings) == 5
    # A replay from the log alone counts them the same way: errored, not failed.
    nc = await connect_nats(settings)
    try:
        summary = (await replay_run(nc.jetstream(), run["runId"])).summary()
    finally:
        await nc.close()
    assert (summary["errored"], summary["failed"], summary["passed"]) == (2, 0, 0)


async def test_a_sandbox_back_before_the_last_attempt_gives_a_real_verdict(
    client, settings, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(BWRAP_ENV_VAR, str(tmp_path / "no-such-bwrap"))
    await client.push_environment(fix_env())
    with FakeOpenAI(fixer) as server:
        run = await client.create_run("fix-add", f"{server.base_url}#m", n=2)

        async def retried() -> bool:
            return await verifier_deliveries(settings) >= 2

        await wait_until(retried, "the verifier to retry the batch")
        monkeypatch.delenv(BWRAP_ENV_VAR)
        done = await client.wait_for_run(run["runId"], timeout_s=120)
    assert done["status"] == "completed"
    if done["passed"] != 2:
        full = await client.get_run(run["runId"], include_rollouts=True)
        raise AssertionError(verdicts_of(full))
    assert done["errored"] == 0 and done["passRate"] == 1.0


async def test_an_object_store_failure_is_retried_then_errored_with_its_cause(
    client, agent_server, settings, monkeypatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's folder should be")
    monkeypatch.setenv(OBJECT_STORE_ENV, (blocker / "objects").as_uri())
    monkeypatch.setenv(INLINE_LIMIT_ENV, "10")  # every trajectory needs the store
    await client.push_environment(refund_env(tasks=1))
    run = await client.create_run("refunds", f"{agent_server.base_url}#m", n=2)
    await client.wait_for_run(run["runId"], timeout_s=120)
    full = await client.get_run(run["runId"], include_rollouts=True, include_trajectories=True)
    assert_errored(full, "infra", "object store failed")
    assert all(r["trajectory"] is None for r in full["rollouts"])


def verdicts_of(run: dict) -> list[tuple]:
    """Each rollout's outcome, reason and error with its primitives' verdicts: what a failed
    assert should show (pytest cuts a list of whole rollout records to their first keys)."""
    return [
        (
            r["outcome"],
            r.get("reason"),
            r.get("error"),
            [(p.get("type"), p.get("passed"), p.get("reason")) for p in r.get("primitives") or []],
        )
        for r in run["rollouts"]
    ]


def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_model_endpoint_that_is_down_is_errored_after_retries(client, monkeypatch) -> None:
    # Down after the run was accepted: the actors' check at creation (test_model_check.py)
    # is off, so the run starts and its rollouts meet the dead endpoint.
    monkeypatch.setenv(TIMEOUT_ENV, "0")
    await client.push_environment(refund_env(tasks=1))
    url = f"http://127.0.0.1:{closed_port()}/v1?retries=1&timeout=2#m"
    run = await client.create_run("refunds", url, n=2)
    await client.wait_for_run(run["runId"], timeout_s=120)
    full = await client.get_run(run["runId"], include_rollouts=True)
    assert_errored(full, "model", "after 2 attempts")


async def test_a_scoring_batch_longer_than_ack_wait_is_not_redelivered(
    settings, monkeypatch
) -> None:
    monkeypatch.setenv(ACK_WAIT_ENV, "1.5")
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "actor", "verifier"):
        platform.start(name)
    client = AsyncClient(settings, timeout_s=20)
    try:
        await wait_for_platform(client, platform)
        # The hidden test takes 4 s: well past the verifier's 1.5 s AckWait.
        await client.push_environment(fix_env("slow-fix", sleep_s=4.0))
        with FakeOpenAI(fixer) as server:
            run = await client.create_run("slow-fix", f"{server.base_url}#m", n=2)
            done = await client.wait_for_run(run["runId"], timeout_s=120)
        full = await client.get_run(run["runId"], include_rollouts=True)
        deliveries = await verifier_deliveries(settings)
        assert done["status"] == "completed" and done["passed"] == 2, (
            verdicts_of(full),
            f"verifier deliveries: {deliveries}",
        )
        generated = await run_events(settings, run["runId"], "rollout.generated")
        scored = await run_events(settings, run["runId"], "rollout.scored")
        assert len(scored) == len(generated) == 1
        # Each generated batch went to the verifier once: no redelivery while it scored.
        assert await verifier_deliveries(settings) == len(generated)
        platform.check()
    finally:
        await client.close()
        await platform.stop_all()


async def test_refund_rollouts_still_get_verdicts(client, agent_server) -> None:
    await client.push_environment(refund_env(tasks=2))
    # A run seed whose 8 sample seeds include some divisible by 4 (the agent's failures).
    run = await client.create_run("refunds", f"{agent_server.base_url}#m", n=4, seed=5)
    await client.wait_for_run(run["runId"], timeout_s=120)
    full = await client.get_run(run["runId"], include_rollouts=True)
    outcomes = {r["rolloutId"]: r["outcome"] for r in full["rollouts"]}
    assert set(outcomes.values()) == {"passed", "failed"}
    assert full["passed"] + full["failed"] == 8 and full["errored"] == 0
    for r in full["rollouts"]:
        assert r["outcome"] == ("passed" if r["seed"] % 4 != 0 else "failed")


async def append_event(settings: Settings, event: EventEnvelope) -> None:
    """Append one event as the admin (what an older platform version, or a lost write, left)."""
    nc = await connect_nats(settings)
    try:
        await EventPublisher(nc.jetstream()).publish(event)
    finally:
        await nc.close()


async def test_a_spec_that_no_longer_validates_errors_the_run_instead_of_stalling_it(
    client, agent_server, settings
) -> None:
    await client.push_environment(refund_env(tasks=1))
    nc = await connect_nats(settings)
    try:
        first, _ = await env_versions.latest(nc.jetstream(), "refunds")
    finally:
        await nc.close()
    assert first is not None
    # Version 2 as a platform that accepted a field since removed would have recorded it.
    stale = first.spec | {"retiredField": True}
    registered = first.model_copy(update={"version": 2, "spec": stale, "spec_hash": "f" * 64})
    await append_event(
        settings, EventEnvelope.new(registered, aggregate_id="refunds", id_parts=("refunds", 2))
    )
    run = await client.create_run(
        "refunds", f"{agent_server.base_url}#m", n=2, env_version=2, deadline_s=90
    )
    done = await client.wait_for_run(run["runId"], timeout_s=120)
    full = await client.get_run(run["runId"], include_rollouts=True)
    # Completed (not failed at its deadline): each rollout errored as the env's fault.
    assert_errored(full, "env", "environment 'refunds' is invalid", "retiredField")
    assert done["errored"] == 2
    # The verifier retried the generated batch, then recorded it rather than dead-lettering.
    assert await verifier_deliveries(settings) == 5
    assert len(await run_events(settings, run["runId"], "rollout.scored")) == 1


async def test_a_run_whose_env_the_verifier_cannot_find_completes_errored_with_the_cause(
    settings,
) -> None:
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "verifier"):
        platform.start(name)
    client = AsyncClient(settings, timeout_s=20)
    try:
        await wait_for_platform(client, platform)
        await client.push_environment(refund_env(tasks=2))
        # A run of a version the registry never recorded (a lost registration): the tracker
        # fans it out; the test is the actor, with real trajectories the verifier can't score.
        run = RunRequested(
            run_id="lostenv01", env_slug="refunds", env_version=9, env_hash="9" * 64,
            model="openai:m", n=2, task_indices=[0, 1], batch_size=3, deadline_s=90,
        )  # fmt: skip
        requested = EventEnvelope.new(
            run, aggregate_id=run.run_id, id_parts=(run.run_id,), run_id=run.run_id
        )
        await append_event(settings, requested)
        for work in work_items(requested, run):
            generated = [
                r.model_copy(update={"error": None, "error_kind": None, "trajectory": {}})
                for r in failed_batch(work, "", actor_id="test")
            ]
            batch = RolloutsGenerated(
                run_id=run.run_id, work_item_id=work.work_item_id, rollouts=generated
            )
            event = EventEnvelope.new(
                batch, aggregate_id=run.run_id, id_parts=(work.work_item_id,), run_id=run.run_id
            )
            await append_event(settings, event)
        done = await client.wait_for_run(run.run_id, timeout_s=120)
        full = await client.get_run(run.run_id, include_rollouts=True)
        assert done["total"] == 4
        assert_errored(
            full,
            "env",
            "no environment to score with",
            "environment 'refunds' version 9 is not registered",
            "after 5 attempts",
        )
        platform.check()
    finally:
        await client.close()
        await platform.stop_all()
