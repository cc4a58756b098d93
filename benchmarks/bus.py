"""Bus throughput: publish -> consume -> project, 1 KiB events, batched vs one at a time.

Baseline, on the same nats-server in the same process: a raw nats-py `publish_async` loop
and a raw pull-consume loop with no projection. Prints events/s and the ratios.

The tracker runs as its own process (`rollout serve tracker`, as deployed; `--tracker-in-process`
runs it as a task of this one, the measure before), started and warmed up with one projected
event before the clock starts. Rounds alternate baseline and ours; each keeps its best.

    python benchmarks/bus.py [--events 5000] [--repeat 3] [--tracker-in-process]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time

import asyncpg
import nats
from pipeline import embedded_servers  # the sibling benchmark's servers

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
from rollout.shared.stack.process import die_with_parent
from rollout.shared.store.db import create_pool, migrate
from rollout.shared.store.projection import ProjectionRunner

PAYLOAD_BYTES = 1024
STOP_TIMEOUT_S = 15.0


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


def tracker_process(settings: Settings) -> subprocess.Popen[bytes]:
    """The tracker as its own process, logging to ROLLOUT_HOME/tracker.log."""
    env = {
        **os.environ,
        "ROLLOUT_HOME": str(settings.home),
        "ROLLOUT_NATS_URL": settings.nats_url,
        "ROLLOUT_NATS_USER": settings.nats_user or "",
        "ROLLOUT_NATS_PASSWORD": settings.nats_password or "",
        "ROLLOUT_DATABASE_URL": settings.database_url or "",
        "ROLLOUT_LOG_LEVEL": "WARNING",
    }
    log = (settings.home / "tracker.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "rollout.cli", "serve", "tracker"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
    )


@contextlib.asynccontextmanager
async def running_tracker(settings: Settings, *, in_process: bool):  # type: ignore[no-untyped-def]
    """A tracker for one scenario, as a process (as deployed) or as a task of this one."""
    if in_process:
        task = asyncio.create_task(serve_tracker(settings))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return
    proc = tracker_process(settings)
    try:
        yield
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def ours(
    settings: Settings, count: int, *, batched: bool, in_process: bool
) -> tuple[float, float]:
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
    try:
        async with running_tracker(settings, in_process=in_process):
            publisher = EventPublisher(js)
            # Warm-up: one event of another run, projected before the clock starts, so the
            # tracker's start (imports, connections, consumers) is not part of the measure.
            await publisher.publish(scored_events(new_id()[:12], 1)[0])
            await projected(pool, await last_sequence(js))
            start = time.perf_counter()
            if batched:
                await publisher.publish_batch(events)
            else:
                for e in events:
                    await publisher.publish(e)
            published = time.perf_counter() - start
            await projected(pool, await last_sequence(js))
            total = time.perf_counter() - start
    finally:
        await pool.close()
        await js.delete_stream(subjects.EVENTS_STREAM)
        await js.delete_stream(subjects.WORK_STREAM)
        await nc.close()
    return count / published, count / total


def best(rounds: list[tuple[float, float]]) -> tuple[float, float]:
    """The best publish rate and the best end-to-end rate over the rounds."""
    return max(r[0] for r in rounds), max(r[1] for r in rounds)


async def main(count: int, repeat: int, in_process: bool) -> None:
    configure_logging("bench", level="WARNING")
    settings, nats_server, pg = embedded_servers("rollout-bench-")
    home = settings.home
    try:
        raws, batches, ones = [], [], []
        for _ in range(repeat):
            # Alternating rounds: a neighbour's burst on a shared machine hits one round of
            # each side, not one side as a whole.
            nc = await nats.connect(
                nats_server.url, user=nats_server.user, password=nats_server.password
            )
            raws.append(await raw_baseline(nc, count))
            await nc.close()
            batches.append(await ours(settings, count, batched=True, in_process=in_process))
            ones.append(await ours(settings, count, batched=False, in_process=in_process))
        (raw_pub, raw_e2e), (batch_pub, batch_e2e) = best(raws), best(batches)
        one_pub, one_e2e = best(ones)
    finally:
        pg.stop()
        nats_server.stop()
    where = "a task of this process" if in_process else "its own process"
    print(f"events: {count} x ~{PAYLOAD_BYTES} B; tracker as {where}; best of {repeat} rounds")
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
    if not in_process:
        logs = (
            (home / "tracker.log").read_text(errors="replace")
            if (home / "tracker.log").exists()
            else ""
        )
        print(f"tracebacks in the tracker processes' log: {logs.count('Traceback')}")
    print(f"batched publish / raw baseline publish: {batch_pub / raw_pub:.2f};"
          f" end to end (with projection) / raw consume: {batch_e2e / raw_e2e:.2f}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds (best kept)")
    parser.add_argument(
        "--tracker-in-process",
        action="store_true",
        help="run the tracker as a task of this process (the measure before) instead of its own",
    )
    args = parser.parse_args()
    asyncio.run(main(args.events, args.repeat, args.tracker_in_process))
