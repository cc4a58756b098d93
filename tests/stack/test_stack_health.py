"""Heartbeats: a running replica is live; a stopped one disappears."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import nats.aio.client
from waiting import wait_until

from rollout.shared.settings import Settings
from rollout.shared.stack.files import write_json
from rollout.shared.stack.health import Beat, heartbeat, read_beats
from rollout.shared.stack.status import collect_status


async def _wait_for_beats(js, predicate, within: float = 10.0) -> list[Beat]:  # noqa: ANN001
    seen: list[list[Beat]] = []

    async def matching() -> bool:
        # A bool, not the beats: "no beats left" is an empty list and still a match.
        seen[:] = [await read_beats(js)]
        return predicate(seen[0])

    try:
        await wait_until(matching, "heartbeats as expected", within, interval_s=0.02)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; beats: {seen}") from None
    return seen[0]


async def test_heartbeat_is_live_then_removed(nats_client: nats.aio.client.Client) -> None:
    js = nats_client.jetstream()
    assert await read_beats(js) == []
    task = asyncio.create_task(heartbeat(js, "svc", "replica-1", interval=0.2))
    # Live: read within a few intervals of its time (a busy machine may need another read).
    beats = await _wait_for_beats(js, lambda b: len(b) == 1 and b[0].live)
    beat = beats[0]
    assert (beat.service, beat.replica_id, beat.pid) == ("svc", "replica-1", os.getpid())
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await _wait_for_beats(js, lambda b: b == [])


async def test_two_replicas_beat_separately(nats_client: nats.aio.client.Client) -> None:
    js = nats_client.jetstream()
    tasks = [asyncio.create_task(heartbeat(js, "svc", f"r{i}", interval=0.2)) for i in range(2)]
    try:
        beats = await _wait_for_beats(js, lambda b: len(b) == 2)
        assert [b.replica_id for b in beats] == ["r0", "r1"]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_a_stale_beat_is_not_live() -> None:
    stale = Beat("svc", "r", 1, "h", time.time() - 60, interval=2.0)
    assert not stale.live


async def test_heartbeats_resume_after_a_nats_restart(fresh_nats, tmp_path) -> None:  # noqa: ANN001
    from rollout.shared.settings import Settings, connect_nats

    settings = Settings(
        home=tmp_path,
        nats_url=fresh_nats.url,
        database_url=None,
        nats_user=fresh_nats.user,
        nats_password=fresh_nats.password,
        external_nats=True,
    )
    beating = await connect_nats(settings, reconnect_time_wait=0.1)
    task = asyncio.create_task(heartbeat(beating.jetstream(), "svc", "r", interval=0.2))
    try:
        first = await _wait_for_beats(beating.jetstream(), lambda b: len(b) == 1)
        fresh_nats.stop()
        fresh_nats.start()
        reader = await connect_nats(settings)
        # Beating again after the restart: a newer beat, and a live one.
        await _wait_for_beats(
            reader.jetstream(),
            lambda b: len(b) == 1 and b[0].time > first[0].time + 0.5 and b[0].live,
        )
        await reader.close()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await beating.close()


async def test_status_counts_each_supervised_replica_by_its_own_beats(
    nats_client: nats.aio.client.Client, nats_settings: Settings
) -> None:
    # `up --tracker-replicas 2` supervises `tracker` and `tracker-2`. The first line counted
    # every tracker's beats, so with the first replica down (crashing, or in restart backoff)
    # it still read healthy ("1 live replica(s)": the second's beat).
    write_json(
        nats_settings.home / "state.json",
        {
            "phase": "ready",
            "services": {
                "tracker": {"service": "tracker", "replica_id": "tracker-aaa"},
                "tracker-2": {"service": "tracker", "replica_id": "tracker-bbb"},
            },
        },
    )
    js = nats_client.jetstream()
    task = asyncio.create_task(heartbeat(js, "tracker", "tracker-bbb", interval=0.2))
    try:
        await _wait_for_beats(js, lambda b: len(b) == 1 and b[0].live)
        lines = {c.name: c for c in await collect_status(nats_settings)}
        assert lines["tracker-2"].healthy, lines["tracker-2"]
        assert not lines["tracker"].healthy, lines["tracker"]
        assert lines["tracker"].replicas == []
        # A replica run outside the supervisor (`rollout serve tracker` elsewhere) still
        # counts for the service's own line, as before.
        extra = asyncio.create_task(heartbeat(js, "tracker", "elsewhere-1", interval=0.2))
        try:
            await _wait_for_beats(js, lambda b: len(b) == 2)
            lines = {c.name: c for c in await collect_status(nats_settings)}
            assert lines["tracker"].healthy, lines["tracker"]
            assert [r["replica_id"] for r in lines["tracker"].replicas] == ["elsewhere-1"]
        finally:
            extra.cancel()
            await asyncio.gather(extra, return_exceptions=True)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
