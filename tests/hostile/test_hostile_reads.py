"""A key that opens more reads of the events stream than the stream may hold consumers.

nats-server 2.15 refuses every consumer create on a stream past 1,000 consumers ("maximum
consumers limit reached"), the services' own included. Reads used to create one consumer
each, and a key could not delete them, so one key (a script waiting on many runs, or a hostile
one) denied every other read of the stream for a minute. Reads are direct gets now and keys
may create no consumer on the stream: the hostile key below holds 1,100 reads open and tries
to create consumers itself, and meanwhile another key reads, follows and waits on a run, the
tracker's credential loads that run, and the admin can still create a durable.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats
import nats.errors
from auth.conftest import make_key, refund_env
from nats.js import api
from nats.js.errors import APIError

from rollout.client import AsyncClient
from rollout.shared import subjects
from rollout.shared.aggregates.run import load_run
from rollout.shared.auth.keys import ApiKey
from rollout.shared.auth.roles import Role
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts import EventEnvelope
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import NatsServer

MODEL = "http://127.0.0.1:9/v1#scripted"
# nats-server's consumer limit on one stream, as measured (docs/scaling.md): more reads than it.
STREAM_CONSUMER_LIMIT = 1000
HOSTILE_READS = STREAM_CONSUMER_LIMIT + 100


async def _consumers(admin: AsyncClient) -> int:
    js = await admin.jetstream()
    return (await js.stream_info(subjects.EVENTS_STREAM)).state.consumer_count


async def test_a_key_holding_more_reads_than_the_consumer_limit_denies_no_other_read(
    service_settings: Settings, services: None, auth_nats: NatsServer, runner_key: ApiKey
) -> None:
    hostile_key = make_key(auth_nats, Role.VIEWER)  # the least a key can be
    admin = AsyncClient(service_settings, timeout_s=20)
    alice = AsyncClient(service_settings, api_key=runner_key.text, timeout_s=20)
    hostile = AsyncClient(service_settings, api_key=hostile_key.text, timeout_s=20)
    reads: list = []
    try:
        await alice.push_environment(refund_env())
        before = await _consumers(admin)  # the services' durables
        hjs = await hostile.jetstream()

        # Its own consumers, made directly: refused by the server (nats-py times out).
        refused = 0
        for i in range(HOSTILE_READS):
            config = api.ConsumerConfig(
                name=f"hostile-{i}", ack_policy=api.AckPolicy.NONE, inactive_threshold=60.0
            )
            try:
                await hjs.add_consumer(subjects.EVENTS_STREAM, config, timeout=0.5)
            except nats.errors.TimeoutError:
                refused += 1
                if refused == 3:
                    break
            except APIError:
                break  # the stream is full: what this test must never see
        assert refused == 3, f"the key created {i - refused} consumers on the events stream"

        # More reads held open at once than the stream may hold consumers.
        for _ in range(HOSTILE_READS):
            read = read_events(hjs, subjects.aggregate_events("env"), follow=True)
            reads.append(read)
            first = await asyncio.wait_for(anext(read), 10)
            assert first.subject.startswith("rollout.evt.env.refunds.")
        assert await _consumers(admin) == before

        # Meanwhile another key starts a run, reads, follows and waits on it; the tracker's
        # credential loads the run (a service's read); the admin can still create a consumer.
        run = await alice.create_run("refunds", MODEL, n=1)
        ajs = await alice.jetstream()
        history = [m async for m in read_events(ajs, subjects.run_events(run["runId"]))]
        assert history, "the other key read nothing of its run"
        # A service's own read, on its own credential: the tracker loading the run's state.
        tracker = auth_nats.services["tracker"]
        service = await nats.connect(
            auth_nats.url,
            user=tracker["user"],
            password=tracker["password"],
            inbox_prefix=subjects.inbox_prefix(tracker["user"]),
        )
        try:
            state = await load_run(service.jetstream(), run["runId"])
        finally:
            await service.close()
        assert state.requested is not None and state.version >= history[-1].metadata.sequence.stream
        waiting = asyncio.ensure_future(alice.wait_for_run(run["runId"], timeout_s=60))
        await alice.cancel_run(run["runId"], reason="done waiting")
        ended = await asyncio.wait_for(waiting, 60)
        assert ended["status"] == "failed"
        followed = read_events(ajs, subjects.run_events(run["runId"]), follow=True)
        names = []
        async for msg in followed:
            names.append(EventEnvelope.from_bytes(msg.data).type)
            if names[-1] == "run.failed":
                break
        await followed.aclose()
        assert names[0] == "run.requested" and names[-1] == "run.failed"
        js = await admin.jetstream()
        probe = api.ConsumerConfig(durable_name="probe", ack_policy=api.AckPolicy.EXPLICIT)
        await js.add_consumer(subjects.EVENTS_STREAM, probe)
        await js.delete_consumer(subjects.EVENTS_STREAM, "probe")
        assert await _consumers(admin) == before
    finally:
        for read in reads:
            with contextlib.suppress(Exception):
                await read.aclose()
        for client in (hostile, alice, admin):
            await client.close()
