"""Bus throughput: publish -> consume -> project, 1 KiB events, batched vs one at a time.

Baseline, on the same nats-server in the same process: a raw nats-py `publish_async` loop
and a raw pull-consume loop with no projection. Prints events/s and the ratios.

    python benchmarks/bus.py [--events 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import asyncpg
import nats

from rollout.services.tracker.main import serve as serve_tracker
from rollout.services.tracker.projections import ReadModels
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import last_sequence
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import EventEnvelope, new_id
from rollout.shared.contracts import events as ev
from rollout.shared.observability import configure_logging
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import start_nats
from rollout.shared.stack.postgres import start_postgres
from rollout.shared.store.db import create_pool, migrate
from rollout.shared.store.projection import ProjectionRunner

PAYLOAD_BYTES = 1024


def scored_events(run_id: str, count: int) -> list[EventEnvelope]:
    """`count` rollout.scored events of about 1 KiB each (one rollout per event)."""
    reason = "x" * 800
    return [
        EventEnvelope.new(
            ev.RolloutsScored(
                run_id=run_id,
                work_item_id=f"w{i}",
                rollouts=[
                    ev.ScoredRollout(
                        rollout_id=f"{run_id}-{i}",
                        task_index=i,
                        sample_index=0,
                        score=1.0,
                        passed=True,
                        primitives=[
                            ev.PrimitiveScore(
                                name="p", type="state_match", weight=1, score=1, passed=True,
                                reason=reason,
                            )
                        ],
                    )
                ],
            ),
            aggregate_id=run_id,
            id_parts=(run_id, i),
            run_id=run_id,
        )
        for i in range(count)
    ]  # fmt: skip


async def raw_baseline(nc: nats.NATS, count: int) -> tuple[float, float]:
    """nats-py alone: async publish of 1 KiB messages, then pull-consume them (no projection)."""
    js = nc.jetstream()
    name = f"RAW_{new_id()[:8]}"
    await js.add_stream(name=name, subjects=[f"raw.{name}.>"])
    body = b"y" * PAYLOAD_BYTES
    start = time.perf_counter()
    futures = [await js.publish_async(f"raw.{name}.e", body) for _ in range(count)]
    await asyncio.gather(*futures)
    published = time.perf_counter() - start
    sub = await js.pull_subscribe(f"raw.{name}.>", durable="raw", stream=name)
    got = 0
    start = time.perf_counter()
    while got < count:
        msgs = await sub.fetch(256, timeout=5)
        for m in msgs:
            await m.ack()
        got += len(msgs)
    consumed = time.perf_counter() - start
    await js.delete_stream(name)
    return count / published, count / (published + consumed)


async def projected(pool: asyncpg.Pool, target: int) -> None:
    """Wait (polling Postgres) until the tracker's read models reach stream position `target`."""
    runner = ProjectionRunner(pool, ReadModels())
    while await runner.position() < target:  # noqa: ASYNC110 (the condition lives in Postgres)
        await asyncio.sleep(0.01)


async def fresh_database(settings: Settings, admin_dsn: str) -> Settings:
    """Each scenario projects into an empty database of its own."""
    name = f"bench_{new_id()[:12]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'create database "{name}"')
    finally:
        await admin.close()
    return settings.with_database(admin_dsn.rsplit("/", 1)[0] + f"/{name}")


async def ours(settings: Settings, count: int, *, batched: bool) -> tuple[float, float]:
    """Our path: EventPublisher (batched or awaited one by one) -> tracker -> Postgres."""
    settings = await fresh_database(settings, settings.database_url)
    nc = await nats.connect(
        settings.nats_url, user=settings.nats_user, password=settings.nats_password
    )
    js = nc.jetstream()
    await ensure_streams(js)
    run_id = new_id()[:12]
    pool = await create_pool(settings.database_url)
    await migrate(pool)
    events = scored_events(run_id, count)
    tracker = asyncio.create_task(serve_tracker(settings))
    try:
        start = time.perf_counter()
        publisher = EventPublisher(js)
        if batched:
            await publisher.publish_batch(events)
        else:
            for e in events:
                await publisher.publish(e)
        published = time.perf_counter() - start
        await projected(pool, await last_sequence(js))
        total = time.perf_counter() - start
    finally:
        tracker.cancel()
        await asyncio.gather(tracker, return_exceptions=True)
        await pool.close()
        await js.delete_stream(subjects.EVENTS_STREAM)
        await js.delete_stream(subjects.WORK_STREAM)
        await nc.close()
    return count / published, count / total


async def main(count: int) -> None:
    configure_logging("bench", level="WARNING")
    home = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    nats_server = start_nats(home / "nats", port=0, monitor_port=0, attached=True)
    pg = start_postgres(home / "pg", port=0, attached=True, fast=True)
    try:
        settings = Settings(
            home=home,
            nats_url=nats_server.url,
            database_url=pg.dsn(),
            nats_user=nats_server.user,
            nats_password=nats_server.password,
        )
        nc = await nats.connect(
            nats_server.url, user=nats_server.user, password=nats_server.password
        )
        raw_pub, raw_e2e = await raw_baseline(nc, count)
        await nc.close()
        batch_pub, batch_e2e = await ours(settings, count, batched=True)
        one_pub, one_e2e = await ours(settings, count, batched=False)
    finally:
        pg.stop()
        nats_server.stop()
    print(f"events: {count} x ~{PAYLOAD_BYTES} B")
    print(f"{'path':<44} {'publish ev/s':>13} {'end-to-end ev/s':>16}")
    print(
        f"{'raw nats-py publish_async + pull (baseline)':<44} {raw_pub:>13,.0f} {raw_e2e:>16,.0f}"
    )
    print(
        f"{'ours, batched publish -> tracker -> Postgres':<44} {batch_pub:>13,.0f} {batch_e2e:>16,.0f}"
    )
    print(f"{'ours, one at a time -> tracker -> Postgres':<44} {one_pub:>13,.0f} {one_e2e:>16,.0f}")
    print(f"batched / one-at-a-time publish: {batch_pub / one_pub:.1f}x;"
          f" end to end: {batch_e2e / one_e2e:.2f}x")  # fmt: skip
    print(f"batched publish / raw baseline publish: {batch_pub / raw_pub:.2f};"
          f" end to end (with projection) / raw consume: {batch_e2e / raw_e2e:.2f}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000)
    asyncio.run(main(parser.parse_args().events))
