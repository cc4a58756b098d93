"""A whole service written with the kit: one work consumer, one request route, Postgres.

The same layout as every platform service: module-level handlers whose dependencies come from
the broker's context (`Pool`), request routes in `ROUTES`, and a `serve` that declares it.
"""

from __future__ import annotations

import asyncio

from faststream.nats import NatsBroker
from pydantic import BaseModel

from rollout.shared import subjects
from rollout.shared.contracts.requests import Reply, Request
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.consumer import Consumer
from rollout.shared.service.routes import Pool, request_route, service_broker
from rollout.shared.settings import Settings

GREETINGS = Consumer(
    subjects.WORK_STREAM, "tiny-greetings", subjects.work_filter("greetings"), title="tiny/greet"
)


class Greeting(BaseModel):
    """A work item: greet someone."""

    name: str


class CountGreetings(Request):
    """How many greetings were stored."""


async def greet(greeting: Greeting, pool: Pool) -> None:
    """Store one greeting (once)."""
    await pool.execute("insert into tiny_greetings values ($1) on conflict do nothing",
                       greeting.name)  # fmt: skip


async def count(query: CountGreetings, pool: Pool) -> Reply:
    """How many greetings are stored."""
    return Reply(data={"greetings": await pool.fetchval("select count(*) from tiny_greetings")})


ROUTES = [request_route(count, "tiny", "count", queue="tiny")]


# Held by serve_gated's build until a test sets it (a service slow to start its brokers).
GATE: asyncio.Event | None = None


async def serve_gated(settings: Settings) -> None:
    """`serve`, whose build waits for GATE first."""

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        assert GATE is not None
        await GATE.wait()
        pool = runtime.database()
        await pool.execute("create table if not exists tiny_greetings(name text primary key)")
        return service_broker(settings, ROUTES, pool=pool)

    await serve_service("tiny", settings, build, database=True)


async def serve(settings: Settings) -> None:
    """Store every greeting in Postgres; answer how many there are."""

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        pool = runtime.database()
        await pool.execute("create table if not exists tiny_greetings(name text primary key)")
        return service_broker(settings, ROUTES, consumers=[(GREETINGS, greet)], pool=pool)

    await serve_service("tiny", settings, build, consumers=[GREETINGS], database=True)
