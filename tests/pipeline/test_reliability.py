"""Failures mid-run on real NATS and Postgres: nothing lost, nothing counted twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import psutil
import pytest
from fakes.openai_server import FakeOpenAI, Reply
from nats.js.errors import NotFoundError
from pipeline.kit import Platform, refund_agent, refund_env, snapshot, wait_for_platform
from waiting import wait_until

from rollout.services.tracker.projections import ReadModels
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import last_sequence, read_events
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts.events import GeneratedRollout, RolloutsGenerated
from rollout.shared.contracts.work import RolloutWork
from rollout.shared.replay import replay_run
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.process import die_with_parent
from rollout.shared.store.projection import ProjectionRunner


def slow_agent(body: dict) -> Reply:
    """The refund agent, 0.15 s per reply: a run lasts long enough to kill things in it."""
    reply = refund_agent(body)
    reply.delay = 0.15
    return reply


def actor_process(settings: Settings, home: Path, name: str) -> subprocess.Popen[bytes]:
    """`rollout serve actor` as its own process (the real entry point)."""
    env = {
        **os.environ,
        "ROLLOUT_HOME": str(home),
        # The platform's one object store, where the actor claim-checks each trajectory.
        "ROLLOUT_OBJECT_STORE_URL": (settings.home / "objects").as_uri(),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
        "ROLLOUT_EXTRA_SERVICES": "actor=rollout.services.actor.main",
        "ROLLOUT_ACTOR_ACK_WAIT_S": "3",
        # One work item at a time: while two are unacknowledged, each replica holds one.
        "ROLLOUT_ACTOR_CONCURRENCY": "1",
    }
    log = (home / f"{name}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "rollout.cli", "serve", "actor", "--replica-id", name],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        # If this test process dies, its actors die with it instead of lingering.
        preexec_fn=die_with_parent,
    )


async def first_scored(settings: Settings, run_id: str) -> None:
    nc = await connect_nats(settings)
    try:
        async for msg in read_events(nc.jetstream(), subjects.run_events(run_id), follow=True):
            if msg.subject.endswith(".rollout_scored"):
                return
    finally:
        await nc.close()


async def test_sigkill_one_of_two_actors_mid_run_loses_and_doubles_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "verifier"):
        platform.start(name)
    actors = [actor_process(settings, tmp_path, f"actor-{i}") for i in (1, 2)]
    from rollout.client import AsyncClient

    client = AsyncClient(settings, timeout_s=20)
    watcher = await connect_nats(settings)
    watch = watcher.jetstream()
    try:

        async def actors_pulling() -> bool:
            # Both replicas connected and asking for work: neither starts after the run ends.
            try:
                info = await watch.consumer_info(subjects.WORK_STREAM, "actors")
            except NotFoundError:  # the first actor to start creates the consumer
                return False
            return info.num_waiting >= 2

        victim = psutil.Process(actors[0].pid)

        async def victim_waits_on_the_model() -> bool:
            # A request of the replica to be killed is held unanswered at the model server: its
            # work item is unacknowledged and cannot have been generated yet.
            ports = {c.laddr.port for c in victim.net_connections(kind="tcp") if c.laddr}
            return bool(ports & server.held_ports)

        with FakeOpenAI(slow_agent) as server:
            await wait_for_platform(client, platform)
            await wait_until(actors_pulling, "both actors pulling work", 60)
            await client.push_environment(refund_env(tasks=3))
            run = await client.create_run(
                "refunds", f"{server.base_url}#slow", n=8, batch_size=2, temperature=0.0
            )
            await asyncio.wait_for(first_scored(settings, run["runId"]), 60)
            # The replica killed must hold a work item it has not generated, for the test to
            # show its recovery: the model server holds its requests until it is dead.
            server.hold()
            await wait_until(victim_waits_on_the_model, "the replica waiting on the model", 60)
            actors[0].send_signal(signal.SIGKILL)
            actors[0].wait()
            server.release()
            done = await client.wait_for_run(run["runId"], timeout_s=180)
        platform.check()
        assert done["status"] == "completed", done
        assert (done["total"], done["generated"], done["scored"]) == (24, 24, 24)
        full = await client.get_run(run["runId"], include_rollouts=True)
        assert len(full["rollouts"]) == 24
        assert len({(r["taskIndex"], r["sampleIndex"]) for r in full["rollouts"]}) == 24
        nc = await connect_nats(settings)
        try:
            js = nc.jetstream()
            info = await js.consumer_info(subjects.WORK_STREAM, "actors")
            assert info.num_ack_pending == 0 and info.num_pending == 0
            # The killed replica held a work item; the survivor generated it on a later delivery.
            replayed = await replay_run(js, run["runId"])
            assert any(g.delivery_attempt >= 2 for g in replayed.generated.values())
        finally:
            await nc.close()
    finally:
        for p in actors:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
        await client.close()
        await watcher.close()
        await platform.stop_all()


async def test_restarting_the_tracker_mid_run_completes_and_matches_a_rebuild(
    settings: Settings,
) -> None:
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "verifier"):
        platform.start(name)
    platform.start("actor", key="actor-1")
    from rollout.client import AsyncClient

    client = AsyncClient(settings, timeout_s=20)
    pool = await asyncpg.create_pool(settings.database_url)
    nc = await connect_nats(settings)
    try:
        with FakeOpenAI(slow_agent) as server:
            await wait_for_platform(client, platform)
            await client.push_environment(refund_env(tasks=2))
            run = await client.create_run("refunds", f"{server.base_url}#slow", n=6, batch_size=2)
            await asyncio.wait_for(first_scored(settings, run["runId"]), 60)
            await platform.stop("tracker")
            platform.start("tracker")
            done = await client.wait_for_run(run["runId"], timeout_s=180)
        assert done["status"] == "completed" and done["scored"] == 12 == done["total"]
        js = nc.jetstream()
        runner = ProjectionRunner(pool, ReadModels())
        target = await last_sequence(js)

        async def caught_up() -> bool:
            return await runner.position() >= target

        await wait_until(caught_up, "the tracker to catch up")
        before = await snapshot(pool)
        await runner.rebuild(js)
        assert await snapshot(pool) == before
    finally:
        await nc.close()
        await pool.close()
        await client.close()
        await platform.stop_all()


async def test_a_verifier_that_raises_on_one_rollout_marks_it_errored_and_the_run_completes(
    settings: Settings,
) -> None:
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "verifier"):
        platform.start(name)
    from rollout.client import AsyncClient

    client = AsyncClient(settings, timeout_s=20)
    nc = await connect_nats(settings)
    try:
        await wait_for_platform(client, platform)
        await client.push_environment(refund_env(tasks=1))
        run = await client.create_run("refunds", "openai/unused", n=3)
        # Play the actor by hand: take the work item, return one trajectory the verifier chokes on.
        js = nc.jetstream()
        from rollout.shared.bus.streams import ensure_consumer, pull_consumer_config

        await ensure_consumer(
            js,
            subjects.WORK_STREAM,
            pull_consumer_config("actors", subjects.work_filter("rollouts")),
        )
        sub = await js.pull_subscribe_bind(durable="actors", stream=subjects.WORK_STREAM)
        (msg,) = await sub.fetch(1, timeout=30)
        work = RolloutWork.model_validate_json(msg.data)
        good = {
            "final_state": {"refunds": [{"order_id": "O-0", "amount": 0}]},
            "final_output": "done",
        }
        broken = {"tool_calls": "this is not a list of tool calls"}
        rollouts = [
            GeneratedRollout(
                rollout_id=item.rollout_id,
                task_index=item.task_index,
                sample_index=item.sample_index,
                model=work.model,
                trajectory=broken if i == 1 else good,
            )
            for i, item in enumerate(work.items)
        ]
        await EventPublisher(js).publish(
            EventEnvelope.new(
                RolloutsGenerated(
                    run_id=work.run_id, work_item_id=work.work_item_id, rollouts=rollouts
                ),
                aggregate_id=work.run_id,
                id_parts=(work.work_item_id,),
                run_id=work.run_id,
            )
        )
        await msg.ack()
        done = await client.wait_for_run(run["runId"], timeout_s=60)
        assert done["status"] == "completed"
        assert (done["scored"], done["passed"], done["errored"]) == (3, 2, 1)
        full = await client.get_run(run["runId"], include_rollouts=True)
        errored = [r for r in full["rollouts"] if r["error"]]
        assert len(errored) == 1 and errored[0]["sampleIndex"] == 1
        assert errored[0]["error"].startswith("verifier raised ValidationError")
        assert errored[0]["status"] == "errored"
        platform.check()
    finally:
        await nc.close()
        await client.close()
        await platform.stop_all()


async def test_the_actor_reads_its_ack_wait_when_it_starts_not_at_import(
    settings: Settings, monkeypatch
) -> None:
    from nats.js.errors import NotFoundError

    from rollout.errors import RolloutError
    from rollout.services.actor import main as actor_main
    from rollout.services.actor import tuning
    from rollout.shared.service import durables

    # The module is long imported (the test's own imports): only a read at start sees this.
    monkeypatch.setenv(tuning.ACK_WAIT_ENV, "4.5")
    platform = Platform(settings)
    platform.start("actor")
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()

        async def consumer_made() -> bool:
            platform.check()
            try:
                await js.consumer_info(subjects.WORK_STREAM, durables.ACTORS.name)
            except NotFoundError:
                return False
            return True

        await wait_until(consumer_made, "the actor to make its consumer")
        info = await js.consumer_info(subjects.WORK_STREAM, durables.ACTORS.name)
        assert info.config.ack_wait == 4.5
    finally:
        await nc.close()
        await platform.stop_all()
    # A bad setting is refused with the variable's name, before the replica connects.
    monkeypatch.setenv(tuning.ACK_WAIT_ENV, "soon")
    with pytest.raises(RolloutError, match="ROLLOUT_ACTOR_ACK_WAIT_S must be a number"):
        await actor_main.serve(settings)
