"""An idle service's pull loop logs nothing: nats-py's bare fetch timeout is made nats' own."""

from __future__ import annotations

import asyncio
import logging

from faststream._internal.endpoint.subscriber.supervisor import TaskCallbackSupervisor
from faststream.nats import JStream, PullSub
from nats.js.client import JetStreamContext

from rollout.shared import subjects
from rollout.shared.bus.broker import make_broker
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.settings import connect_nats

EMPTY_POLLS = 300


async def test_an_idle_pull_loop_logs_no_supervisor_traceback(
    settings, caplog, monkeypatch
) -> None:
    """FastStream restarted the idle pull task with a traceback ("raised an exception")."""
    broker = make_broker(settings)  # every service's broker installs the fix
    fixed = JetStreamContext.PullSubscription.fetch
    assert getattr(fixed, "_rollout_nats_timeouts", False)
    polls = asyncio.Event()
    count = 0

    async def counting_fetch(self, *args, **kwargs):
        nonlocal count
        count += 1
        if count >= EMPTY_POLLS:
            polls.set()
        return await fixed(self, *args, **kwargs)

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", counting_fetch)

    @broker.subscriber(
        "rollout.evt.idle.>",
        stream=JStream(subjects.EVENTS_STREAM, declare=False),
        durable="idle-probe",
        pull_sub=PullSub(batch_size=8, timeout=0.01),
    )
    async def handle(body: dict) -> None:  # nothing is ever published on it
        raise AssertionError(body)

    nc = await connect_nats(settings)
    try:
        await ensure_streams(nc.jetstream())
    finally:
        await nc.close()
    # FastStream prints each distinct traceback once per process: forget earlier ones.
    TaskCallbackSupervisor._TaskCallbackSupervisor__cache.clear()
    with caplog.at_level(logging.ERROR, logger="rollout.faststream"):
        await broker.start()
        try:
            # A 10 ms poll budget: wait for 300 empty polls (the bad timeout shows within a few hundred).
            await asyncio.wait_for(polls.wait(), timeout=30)
        finally:
            await broker.stop()
    assert not [r for r in caplog.records if "raised an exception" in r.getMessage()]
