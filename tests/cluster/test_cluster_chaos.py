"""Failures of the bus and the database mid-run on a 3-node cluster: every rollout scored once."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_kit import kill_node, restart_node, wait_for_stream_leaders
from fakes.openai_server import FakeOpenAI, Reply
from pipeline.kit import Platform, refund_agent, refund_env, wait_for_platform
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts import events as ev
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.nats import NatsCluster
from rollout.shared.stack.postgres import PostgresServer, start_postgres

pytestmark = pytest.mark.slow

STREAMS = [subjects.EVENTS_STREAM, subjects.WORK_STREAM]
TASKS, SAMPLES = 3, 6
TOTAL = TASKS * SAMPLES
# Every rollout is two model calls. Calls past each mark wait for that gate's go-ahead, so the
# run is still going when each failure is injected, and goes on between them.
MARKS = (12, 28)


class GatedAgent:
    """The scripted refund agent whose calls past MARKS[i] wait until `release(i)`."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        self.gates = [threading.Event() for _ in MARKS]

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.calls += 1
            held = [gate for mark, gate in zip(MARKS, self.gates, strict=True) if self.calls > mark]
        for gate in held:
            # A server thread, not the test's loop: the actors' HTTP calls just take longer.
            gate.wait(timeout=90)
        reply = refund_agent(body)
        reply.delay = 0.02
        return reply

    def release(self, *gates: int) -> None:
        """Let the calls held at these gates (all, when none named) through."""
        for i in gates or range(len(self.gates)):
            self.gates[i].set()


@pytest.fixture
def agent() -> Iterator[tuple[GatedAgent, FakeOpenAI]]:
    """The gated agent over real HTTP."""
    gated = GatedAgent()
    with FakeOpenAI(gated) as server:
        yield gated, server
        gated.release()


@contextlib.asynccontextmanager
async def _platform(settings: Settings) -> AsyncIterator[tuple[Platform, AsyncClient]]:
    """Every service in-process, each as its own user, and a client once they answer."""
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "verifier", "buffer", "learner"):
        platform.start(name)
    platform.start("actor", key="actor-1")
    platform.start("actor", key="actor-2")
    client = AsyncClient(settings, timeout_s=20)
    try:
        await wait_for_platform(client, platform)
        yield platform, client
        platform.check()
    finally:
        await client.close()
        await platform.stop_all()


@pytest.fixture
async def cluster_platform(
    cluster_settings: Settings,
) -> AsyncIterator[tuple[Platform, AsyncClient]]:
    """Every service in-process, each as its own user, against the 3-node cluster."""
    async with _platform(cluster_settings) as pair:
        yield pair


async def _progress(client: AsyncClient, run_id: str) -> dict[str, Any]:
    """The run as the tracker reports it ({} while the tracker cannot answer)."""
    try:
        return await client.get_run(run_id)
    except RolloutError:
        return {}  # e.g. the database is down: ask again


async def _until(client: AsyncClient, run_id: str, what: str, done: Any, limit_s: float) -> None:
    async def reached() -> bool:
        return bool(done(await _progress(client, run_id)))

    await wait_until(reached, what, limit_s)


async def _start_run(client: AsyncClient, server: FakeOpenAI) -> str:
    await client.push_environment(refund_env(tasks=TASKS))
    # One rollout a work item: with several items in flight at once (actor concurrency), a
    # bigger item could have each of its rollouts held at a different gate, and none scored.
    run = await client.create_run(
        "refunds", f"{server.base_url}#gated", n=SAMPLES, batch_size=1, temperature=0.0
    )
    run_id = run["runId"]
    await _until(client, run_id, "a first scored rollout", lambda r: r.get("scored"), 60)
    return run_id


async def _generated_in_log(settings: Settings, run_id: str) -> int:
    """How many of the run's rollouts the events stream says were generated."""
    nc = await connect_nats(settings)
    try:
        ids: set[str] = set()
        async for msg in read_events(nc.jetstream(), subjects.run_events(run_id)):
            body = EventEnvelope.from_bytes(msg.data).body()
            if isinstance(body, ev.RolloutsGenerated):
                ids |= {r.rollout_id for r in body.rollouts}
        return len(ids)
    finally:
        await nc.close()


async def _assert_scored_exactly_once(settings: Settings, client: AsyncClient, run_id: str) -> None:
    """The run completed with TOTAL scored (read model), and the log scores each rollout once."""
    await _until(
        client, run_id, "the run to complete", lambda r: r.get("status") == "completed", 120
    )
    done = await client.get_run(run_id, include_rollouts=True)
    assert (done["total"], done["generated"], done["scored"]) == (TOTAL, TOTAL, TOTAL), done
    keys = {(r["taskIndex"], r["sampleIndex"]) for r in done["rollouts"]}
    assert len(done["rollouts"]) == TOTAL == len(keys)
    nc = await connect_nats(settings)
    try:
        scores: Counter[str] = Counter()
        generated: set[str] = set()
        completions = 0
        async for msg in read_events(nc.jetstream(), subjects.run_events(run_id)):
            body = EventEnvelope.from_bytes(msg.data).body()
            if isinstance(body, ev.RolloutsGenerated):
                generated |= {r.rollout_id for r in body.rollouts}
            elif isinstance(body, ev.RolloutsScored):
                scores.update(s.rollout_id for s in body.rollouts)
            elif isinstance(body, ev.RunCompleted):
                completions += 1
    finally:
        await nc.close()
    assert len(generated) == TOTAL
    assert set(scores) == generated and set(scores.values()) == {1}, scores.most_common(3)
    assert completions == 1


async def test_sigkill_a_nats_node_restart_it_kill_another_every_rollout_scored_once(
    nats_cluster: NatsCluster,
    cluster_settings: Settings,
    cluster_platform: tuple[Platform, AsyncClient],
    agent: tuple[GatedAgent, FakeOpenAI],
) -> None:
    platform, client = cluster_platform
    gated, server = agent
    nc = await connect_nats(cluster_settings)
    try:
        js = nc.jetstream()
        run_id = await _start_run(client, server)

        # 1. SIGKILL the events stream's leader while rollouts flow.
        leaders = await wait_for_stream_leaders(js, STREAMS)
        first = nats_cluster.node(leaders[subjects.EVENTS_STREAM])
        kill_node(first)
        await wait_for_stream_leaders(js, STREAMS, replicas=2, not_on=first.server_name)
        before = (await _progress(client, run_id)).get("scored", 0)
        gated.release(0)
        await _until(client, run_id, "progress on two nodes", lambda r: r["scored"] > before, 60)

        # 2. Bring it back (it catches up from the others), then SIGKILL another node.
        await restart_node(nats_cluster, first)
        leaders = await wait_for_stream_leaders(js, STREAMS)
        second = nats_cluster.node(leaders[subjects.EVENTS_STREAM])
        if second is first:
            second = next(n for n in nats_cluster.nodes if n is not first)
        assert (await _progress(client, run_id))["status"] == "running"
        kill_node(second)
        gated.release(1)
        platform.check()
        await _assert_scored_exactly_once(cluster_settings, client, run_id)
    finally:
        await nc.close()


@pytest.fixture
def own_postgres(stack_home: Path) -> Iterator[PostgresServer]:
    """A Postgres of this test's own, to stop and start mid-run."""
    server = start_postgres(stack_home, port=0, attached=True, fast=True)
    yield server
    server.stop()


async def test_restarting_postgres_mid_run_every_rollout_scored_once(
    make_cluster_settings: Callable[[str | None], Settings],
    own_postgres: PostgresServer,
    agent: tuple[GatedAgent, FakeOpenAI],
) -> None:
    settings = make_cluster_settings(own_postgres.url)
    gated, server = agent
    async with _platform(settings) as (platform, client):
        run_id = await _start_run(client, server)
        await asyncio.to_thread(own_postgres.stop)
        assert await _progress(client, run_id) == {}  # the tracker cannot read its models
        # Rollouts go on into the log with the database gone; the projections retry them.
        before = await _generated_in_log(settings, run_id)
        gated.release(0)

        async def more_generated() -> bool:
            return await _generated_in_log(settings, run_id) > before

        await wait_until(more_generated, "rollouts generated while Postgres is down", 60)
        await asyncio.to_thread(own_postgres.start, attached=True)
        gated.release(1)
        platform.check()
        await _assert_scored_exactly_once(settings, client, run_id)
