"""Fixtures: the platform's services in this test's event loop on real NATS and Postgres.

A folder's conftest.py imports the ones its tests use (pipeline, tracker).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAI
from pipeline.kit import Platform, refund_agent, wait_for_platform

from rollout.client import AsyncClient
from rollout.shared.bus.streams import ensure_consumer
from rollout.shared.service import durables
from rollout.shared.settings import Settings, connect_nats


@pytest.fixture
async def platform(settings: Settings) -> AsyncIterator[Platform]:
    """Registry, tracker, two actors and a verifier in-process."""
    p = Platform(settings)
    for name in ("env-registry", "tracker", "verifier"):
        p.start(name)
    p.start("actor", key="actor-1")
    p.start("actor", key="actor-2")
    yield p
    p.check()
    await p.stop_all()


@pytest.fixture
async def client(settings: Settings, platform: Platform) -> AsyncIterator[AsyncClient]:
    """A client of the in-process platform, once the registry and tracker answer."""
    c = AsyncClient(settings, timeout_s=20)
    await wait_for_platform(c, platform)
    yield c
    await c.close()


@pytest.fixture
def agent_server() -> Iterator[FakeOpenAI]:
    """The scripted refund agent over real HTTP."""
    with FakeOpenAI(refund_agent) as server:
        yield server


@contextlib.asynccontextmanager
async def without(
    settings: Settings, missing: str, consumer: durables.Consumer
) -> AsyncIterator[tuple[Platform, AsyncClient, Any]]:
    """The platform less service `missing` (the test plays its replicas that died, on the
    durable `consumer`, ensured first), a client and JetStream."""
    platform = Platform(settings)
    for name in ("env-registry", "tracker", "actor", "verifier"):
        if name != missing:
            platform.start(name)
    client = AsyncClient(settings, timeout_s=20)
    nc = await connect_nats(settings)
    try:
        await wait_for_platform(client, platform)
        js = nc.jetstream()
        await ensure_consumer(js, consumer.stream, consumer.config())
        yield platform, client, js
        platform.check()
    finally:
        await nc.close()
        await client.close()
        await platform.stop_all()


@pytest.fixture
async def actorless(settings: Settings) -> AsyncIterator[tuple[Platform, AsyncClient, Any]]:
    """The platform without actors, a client, JetStream."""
    async with without(settings, "actor", durables.ACTORS) as parts:
        yield parts
