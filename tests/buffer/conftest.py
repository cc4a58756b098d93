"""Fixtures: the platform's services plus the buffer, in this test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from buffer_kit import BufferPlatform
from fakes.openai_server import FakeOpenAI
from pipeline.kit import refund_agent, wait_for_platform

from rollout.client import AsyncClient
from rollout.shared.objectstore import LocalObjectStore
from rollout.shared.settings import Settings


@pytest.fixture
def store(settings: Settings) -> LocalObjectStore:
    """The platform's object store: the actor's trajectories, the buffer's large answers."""
    return LocalObjectStore(settings.home / "objects")


@pytest.fixture
async def platform(settings: Settings, store: LocalObjectStore) -> AsyncIterator[BufferPlatform]:
    """Registry, tracker, an actor and a verifier in-process; the test starts the buffer."""
    p = BufferPlatform(settings, store)
    for name in ("env-registry", "tracker", "verifier", "actor"):
        p.start(name)
    yield p
    p.check()
    await p.stop_all()


@pytest.fixture
async def bare(settings: Settings, store: LocalObjectStore) -> AsyncIterator[BufferPlatform]:
    """Only the env registry: the test appends run events itself, then starts the buffer."""
    p = BufferPlatform(settings, store)
    p.start("env-registry")
    yield p
    p.check()
    await p.stop_all()


@pytest.fixture
async def client(settings: Settings, platform: BufferPlatform) -> AsyncIterator[AsyncClient]:
    """A client of the in-process platform, once the registry and tracker answer."""
    c = AsyncClient(settings, timeout_s=20)
    await wait_for_platform(c, platform)
    yield c
    await c.close()


@pytest.fixture
def agent_server() -> Iterator[FakeOpenAI]:
    """The scripted refund agent over real HTTP (wrong when its seed is divisible by 4)."""
    with FakeOpenAI(refund_agent) as server:
        yield server
