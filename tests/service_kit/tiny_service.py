"""A whole service written with the kit: one work consumer, one request handler, Postgres."""

from __future__ import annotations

from faststream.nats import NatsBroker
from pydantic import BaseModel

from rollout.shared import subjects
from rollout.shared.bus.broker import make_broker
from rollout.shared.contracts.requests import Reply, Request
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.consumer import Consumer
from rollout.shared.settings import Settings

GREETINGS = Consumer(
    subjects.WORK_STREAM, "tiny-greetings", subjects.work_filter("greetings"), title="tiny/greet"
)


class Greeting(BaseModel):
    """A work item: greet someone."""

    name: str


class CountGreetings(Request):
    """How many greetings were stored."""


async def serve(settings: Settings) -> None:
    """Store every greeting in Postgres; answer how many there are."""

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        pool = runtime.database()
        await pool.execute("create table if not exists tiny_greetings(name text primary key)")
        broker = make_broker(settings)

        @GREETINGS.subscriber(broker)
        async def greet(greeting: Greeting) -> None:
            await pool.execute("insert into tiny_greetings values ($1) on conflict do nothing",
                               greeting.name)  # fmt: skip

        @broker.subscriber(subjects.request("tiny", "count"), queue="tiny")
        async def count(query: CountGreetings) -> Reply:
            total = await pool.fetchval("select count(*) from tiny_greetings")
            return Reply(data={"greetings": total})

        return broker

    await serve_service("tiny", settings, build, consumers=[GREETINGS], database=True)
