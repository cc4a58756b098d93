"""A run requested while the work queue cannot be written starts once it can again, however long
the outage lasted: its fan-out is retried, never given up on (given up on, the run sat started
with nothing queued until its deadline, then failed blaming the actors and verifiers)."""

from __future__ import annotations

from typing import Any

from fakes.openai_server import FakeOpenAI
from nats.aio.msg import Msg
from pipeline.kit import Platform, refund_agent, refund_env
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.shared import subjects
from rollout.shared.bus.attempts import DEFAULT_MAX_DELIVER
from rollout.shared.bus.streams import ensure_consumer, ensure_streams
from rollout.shared.service import durables
from rollout.shared.settings import Settings, connect_nats


async def test_a_fan_out_that_fails_past_its_old_retries_still_starts_the_run(
    actorless: tuple[Platform, AsyncClient, Any], settings: Settings
) -> None:
    platform, client, js = actorless
    await client.push_environment(refund_env(tasks=1))
    # The work queue answers no write, as a stream without a leader (a cluster electing one).
    await js.delete_stream(subjects.WORK_STREAM)
    # Each settlement of a fan-out delivery is a message on its ack subject, which names the
    # delivery's number: seen here as the tracker tries again.
    settled: list[int] = []

    async def on_ack(msg: Msg) -> None:
        tokens = msg.subject.split(".")
        if tokens[3] == durables.TRACKER_FANOUT.name:
            settled.append(int(tokens[4]))

    def outlasted_the_old_retries() -> bool:
        return max(settled, default=0) >= DEFAULT_MAX_DELIVER

    nc = await connect_nats(settings)
    try:
        sub = await nc.subscribe(f"$JS.ACK.{subjects.EVENTS_STREAM}.>", cb=on_ack)
        with FakeOpenAI(refund_agent) as server:
            run = await client.create_run("refunds", f"{server.base_url}#scripted", n=2)
            await wait_until(outlasted_the_old_retries, "the fan-out to fail 5 times", 60)
            await sub.unsubscribe()
            # The outage ends: the queue takes writes again, and the actors come.
            await ensure_streams(js)
            await ensure_consumer(js, subjects.WORK_STREAM, durables.ACTORS.config())
            platform.start("actor")
            done = await client.wait_for_run(run["runId"], timeout_s=120)
    finally:
        await nc.close()
    assert done["status"] == "completed" and done["scored"] == 2, done
