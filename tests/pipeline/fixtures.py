"""Fixtures: the platform's services in this test's event loop on real NATS and Postgres.

A folder's conftest.py imports the ones its tests use (pipeline, tracker).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from fakes.openai_server import FakeOpenAI
from pipeline.kit import Platform, refund_agent, wait_for_platform

from rollout.client import AsyncClient
from rollout.shared.settings import Settings


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
