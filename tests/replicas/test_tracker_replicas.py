"""Two tracker replicas on real NATS and Postgres: one leader, failover, no double effects."""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats.aio.client
import pytest
from fakes.openai_server import FakeOpenAI, Reply
from pipeline.kit import Platform, refund_agent, refund_env, wait_for_platform
from replicas_kit import (
    assert_read_models_equal_a_rebuild,
    assert_scored_once,
    holder_pid,
    leader,
    standing_by,
    terms,
    tracker_process,
)
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.tracker import runs
from rollout.services.tracker.leader import LEASE_NAME, LEASE_TTL_ENV
from rollout.shared import subjects
from rollout.shared.aggregates.run import load_run
from rollout.shared.bus.lease import Lease, bucket_ttl, lease_bucket
from rollout.shared.bus.publisher import ConcurrencyConflict, EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts.events import RunFailed, RunRequested, RunStarted
from rollout.shared.settings import Settings

TTL_S = 1.5


def slow_agent(body: dict) -> Reply:
    """The refund agent, 0.1 s per reply: the run is still going when a tracker goes."""
    reply = refund_agent(body)
    reply.delay = 0.1
    return reply


async def _new_leader(settings: Settings, old: str | None, limit_s: float) -> tuple[str, float]:
    """(holder, seconds) once the lease is held by someone other than `old`."""
    start = time.monotonic()
    found: list[str] = []

    async def taken() -> bool:
        holder = await leader(settings)
        if holder is not None and holder != old:
            found.append(holder)
            return True
        return False

    await wait_until(taken, "a tracker to take the lease", limit_s)
    return found[0], time.monotonic() - start


async def _progress(client: AsyncClient, run_id: str) -> dict[str, Any]:
    """The run as the tracker reports it ({} before its projection has it)."""
    try:
        return await client.get_run(run_id)
    except RolloutError:
        return {}


async def test_a_deposed_leaders_late_decision_is_refused(
    nats_client: nats.aio.client.Client,
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    run_id = "fenced-run"
    requested = RunRequested(
        run_id=run_id,
        env_slug="refunds",
        env_version=1,
        env_hash="h",
        model="local/tiny-agent",
        n=2,
        task_indices=[0],
        deadline_s=1.0,
    )
    event = EventEnvelope.new(requested, aggregate_id=run_id, id_parts=(run_id,), run_id=run_id)
    await EventPublisher(js).publish(event, expected_last_subject_seq=0)
    kv = await lease_bucket(js, 1.0)
    ttl = await bucket_ttl(kv)
    old, new = Lease(kv, LEASE_NAME, "old", ttl), Lease(kv, LEASE_NAME, "new", ttl)
    assert await old.try_acquire()

    # The old leader reads the run and decides, then stalls before appending.
    later = datetime.now(UTC) + timedelta(seconds=10)
    stale = await load_run(js, run_id)
    late_ending = stale.decide(later)
    assert isinstance(late_ending, RunFailed)

    # Its lease runs out; the standby takes it and decides the same run from its events.
    async def took_over() -> bool:
        return await new.try_acquire()

    await wait_until(took_over, "the standby to take the lease", 5)
    assert not old.held and not await old.renew()
    assert isinstance(await runs.settle(js, run_id, now=later), RunFailed)

    # The old leader wakes up: its writes name a history that moved, so they are refused.
    with pytest.raises(ConcurrencyConflict):
        await runs.append_to_run(js, stale, late_ending)
    with pytest.raises(ConcurrencyConflict):
        await runs.append_to_run(
            js, stale, RunStarted(run_id=run_id, work_items=1, total_rollouts=2)
        )
    types = [
        EventEnvelope.from_bytes(msg.data).type
        async for msg in read_events(js, subjects.run_events(run_id))
    ]
    assert types == ["run.requested", "run.failed"]


async def test_two_in_process_trackers_one_leads_and_the_other_takes_over_on_stop(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEASE_TTL_ENV, str(TTL_S))
    platform = Platform(settings)
    client = AsyncClient(settings, timeout_s=20)
    try:
        platform.start("tracker", key="tracker-1")
        first, _ = await _new_leader(settings, None, 60)
        # The second replica comes up as a standby: the lease stays where it is.
        platform.start("tracker", key="tracker-2")
        for name in ("env-registry", "verifier"):
            platform.start(name)
        platform.start("actor", key="actor-1")
        platform.start("actor", key="actor-2")
        with FakeOpenAI(slow_agent) as server:
            await wait_for_platform(client, platform)
            await client.push_environment(refund_env(tasks=3))
            run = await client.create_run("refunds", f"{server.base_url}#slow", n=4, batch_size=2)
            run_id = run["runId"]

            async def some_scored() -> bool:
                return (await _progress(client, run_id)).get("scored", 0) > 0

            await wait_until(some_scored, "a first scored rollout", 60)
            assert await leader(settings) == first
            # A clean stop gives the lease up: the standby leads within a poll, not a TTL.
            await platform.stop("tracker-1")
            second, took = await _new_leader(settings, first, 10)
            assert took < TTL_S, took
            done = await client.wait_for_run(run_id, timeout_s=120)
        platform.check()
        assert done["status"] == "completed", done
        assert (done["total"], done["generated"], done["scored"]) == (12, 12, 12)
        await assert_scored_once(settings, run_id, 12)
        await assert_read_models_equal_a_rebuild(settings)
        assert await leader(settings) == second
    finally:
        await client.close()
        await platform.stop_all()


@pytest.mark.slow
async def test_sigkill_the_leading_tracker_mid_run_the_standby_finishes_it_once(
    settings: Settings, tmp_path: Path
) -> None:
    trackers = [tracker_process(settings, tmp_path, f"tracker-{i}", TTL_S) for i in (1, 2)]
    platform = Platform(settings)
    for name in ("env-registry", "verifier"):
        platform.start(name)
    platform.start("actor", key="actor-1")
    platform.start("actor", key="actor-2")
    client = AsyncClient(settings, timeout_s=20)
    try:
        with FakeOpenAI(slow_agent) as server:
            await wait_for_platform(client, platform)
            first, _ = await _new_leader(settings, None, 60)
            for i in (1, 2):
                # Both past their start-up, so the failover below times the lease, not a boot.
                await wait_until(
                    lambda i=i: standing_by(tmp_path, f"tracker-{i}"), f"tracker-{i} to start", 60
                )
            by_pid = {p.pid: p for p in trackers}
            assert holder_pid(first) in by_pid
            await client.push_environment(refund_env(tasks=3))
            run = await client.create_run("refunds", f"{server.base_url}#slow", n=8, batch_size=2)
            run_id = run["runId"]

            async def some_scored() -> bool:
                return (await _progress(client, run_id)).get("scored", 0) >= 4

            await wait_until(some_scored, "some scored rollouts", 90)
            killed = by_pid[holder_pid(first)]
            names = {p.pid: f"tracker-{i}" for i, p in enumerate(trackers, start=1)}
            survivor = next(p for p in trackers if p is not killed)
            # Exactly one leader so far: the lease's holder, elected once; the other stood by.
            assert terms(tmp_path, names[killed.pid]) == 1
            assert terms(tmp_path, names[survivor.pid]) == 0
            killed.send_signal(signal.SIGKILL)
            killed.wait()
            # The dead leader stops renewing: its key expires after one TTL, and the
            # standby's next try (a tenth of a TTL later) takes it.
            second, took = await _new_leader(settings, first, TTL_S * 4)
            assert holder_pid(second) in by_pid and holder_pid(second) != killed.pid
            assert took <= TTL_S + 1.0, f"failover took {took:.2f}s (TTL {TTL_S}s)"
            # The survivor answers (it always did) and the run moves on.
            before = (await client.get_run(run_id))["scored"]

            async def progressed() -> bool:
                current = await client.get_run(run_id)
                return current["scored"] > before or current["status"] == "completed"

            await wait_until(progressed, "progress after the failover", 60)
            done = await client.wait_for_run(run_id, timeout_s=180)
        platform.check()
        assert done["status"] == "completed", done
        assert (done["total"], done["generated"], done["scored"]) == (24, 24, 24)
        full = await client.get_run(run_id, include_rollouts=True)
        assert len({(r["taskIndex"], r["sampleIndex"]) for r in full["rollouts"]}) == 24
        await assert_scored_once(settings, run_id, 24)
        await assert_read_models_equal_a_rebuild(settings)
        assert survivor.poll() is None
        assert terms(tmp_path, names[survivor.pid]) == 1
    finally:
        for p in trackers:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
        await client.close()
        await platform.stop_all()


@pytest.mark.parametrize(
    ("raw", "problem"),
    [("soon", "must be a number of seconds, got 'soon'"), ("0.1", "between 0.5 and 60")],
)
def test_a_bad_lease_ttl_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, raw: str, problem: str
) -> None:
    from rollout.services.tracker.leader import lease_ttl_s

    monkeypatch.setenv(LEASE_TTL_ENV, raw)
    with pytest.raises(RolloutError, match=LEASE_TTL_ENV) as caught:
        lease_ttl_s()
    assert problem in str(caught.value)
