"""Helpers for tracker-replica tests: tracker processes, the lease's holder, exactly-once checks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import asyncpg
import nats.js.errors
from pipeline.kit import as_service, snapshot
from waiting import wait_until

from rollout.services.tracker.leader import LEASE_NAME, LEASE_TTL_ENV
from rollout.services.tracker.projections import ReadModels
from rollout.shared import subjects
from rollout.shared.bus.lease import BUCKET, current_holder
from rollout.shared.bus.reader import last_sequence, read_events
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts import events as ev
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.process import die_with_parent
from rollout.shared.store.projection import ProjectionRunner


def tracker_process(
    settings: Settings, home: Path, name: str, ttl_s: float
) -> subprocess.Popen[bytes]:
    """`rollout serve tracker` as its own process, as the tracker's own NATS user."""
    own = as_service(settings, "tracker")
    env = {
        **os.environ,
        "ROLLOUT_HOME": str(home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": own.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": own.nats_password or "",
        "ROLLOUT_DATABASE_URL": settings.database_url or "",
        LEASE_TTL_ENV: str(ttl_s),
    }
    log = (home / f"{name}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "rollout.cli", "serve", "tracker", "--replica-id", name],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        # If this test process dies, its trackers die with it instead of lingering.
        preexec_fn=die_with_parent,
    )


async def standing_by(home: Path, name: str) -> bool:
    """True once tracker process `name` logged that it runs for the lease (its log says so)."""
    path = home / f"{name}.log"
    return path.exists() and '"event": "tracker started"' in path.read_text(errors="replace")


def terms(home: Path, name: str) -> int:
    """How many times tracker process `name` logged that it became the leader."""
    path = home / f"{name}.log"
    return path.read_text(errors="replace").count('"event": "leader elected"')


async def leader(settings: Settings) -> str | None:
    """The tracker lease's holder now (None: no leader)."""
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        try:
            kv = await js.key_value(BUCKET)
        except nats.js.errors.BucketNotFoundError:
            return None  # no tracker got as far as electing one
        return await current_holder(kv, LEASE_NAME)
    finally:
        await nc.close()


def holder_pid(holder: str) -> int:
    """The process id in a tracker's lease holder name (host-pid-nonce)."""
    return int(holder.rsplit("-", 2)[1])


async def assert_scored_once(settings: Settings, run_id: str, total: int) -> None:
    """The log: `total` rollouts generated, each scored once; started and completed once."""
    nc = await connect_nats(settings)
    try:
        scores: Counter[str] = Counter()
        generated: set[str] = set()
        kinds: Counter[str] = Counter()
        async for msg in read_events(nc.jetstream(), subjects.run_events(run_id)):
            body = EventEnvelope.from_bytes(msg.data).body()
            kinds[type(body).__name__] += 1
            if isinstance(body, ev.RolloutsGenerated):
                generated |= {r.rollout_id for r in body.rollouts}
            elif isinstance(body, ev.RolloutsScored):
                scores.update(s.rollout_id for s in body.rollouts)
    finally:
        await nc.close()
    assert len(generated) == total
    assert set(scores) == generated and set(scores.values()) == {1}, scores.most_common(3)
    assert (kinds["RunStarted"], kinds["RunCompleted"], kinds["RunFailed"]) == (1, 1, 0), kinds


async def assert_read_models_equal_a_rebuild(settings: Settings) -> None:
    """Once the projection caught up with the log, its rows are what a replay makes."""
    pool = await asyncpg.create_pool(settings.database_url)
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        runner = ProjectionRunner(pool, ReadModels())
        target = await last_sequence(js)

        async def caught_up() -> bool:
            return await runner.position() >= target

        await wait_until(caught_up, "the leader's projection to catch up")
        before = await snapshot(pool)
        await runner.rebuild(js)
        assert await snapshot(pool) == before
    finally:
        await nc.close()
        await pool.close()
