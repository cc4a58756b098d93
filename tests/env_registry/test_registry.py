"""The env registry on real NATS: versions decided from the env's own events, appended once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pipeline.kit import Platform, refund_env
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts import EventEnvelope
from rollout.shared.settings import Settings, connect_nats


@pytest.fixture
async def registry(settings: Settings) -> AsyncIterator[AsyncClient]:
    """The env registry alone, in this test's loop, and a client once it answers."""
    platform = Platform(settings)
    platform.start("env-registry")
    client = AsyncClient(settings, timeout_s=20)

    async def answering() -> bool:
        platform.check()
        try:
            await client.list_environments()
        except RolloutError:
            return False
        return True

    await wait_until(answering, "the registry to answer", 30)
    yield client
    await client.close()
    platform.check()
    await platform.stop_all()


def _with_instruction(env: dict[str, Any], text: str) -> dict[str, Any]:
    changed = {**env, "tasks": [dict(t) for t in env["tasks"]]}
    changed["tasks"][0]["instruction"] = text
    return changed


async def _registrations(settings: Settings, slug: str) -> list[int]:
    nc = await connect_nats(settings)
    try:
        events = [
            EventEnvelope.from_bytes(m.data).body()
            async for m in read_events(nc.jetstream(), subjects.aggregate_events("env", slug))
        ]
    finally:
        await nc.close()
    return [e.version for e in events]


async def test_same_content_keeps_its_version_and_new_content_gets_the_next(
    registry: AsyncClient, settings: Settings
) -> None:
    env = refund_env(slug="versions")
    first = await registry.push_environment(env)
    assert (first["version"], first["created"]) == (1, True)
    again = await registry.push_environment(env)
    assert (again["version"], again["created"], again["spec_hash"]) == (
        1,
        False,
        first["spec_hash"],
    )
    second = await registry.push_environment(_with_instruction(env, "Refund order A-2."))
    assert (second["version"], second["created"]) == (2, True)
    assert second["spec_hash"] != first["spec_hash"]
    newest = await registry.get_environment("versions")
    older = await registry.get_environment("versions", 1)
    assert newest["version"] == 2 and older["version"] == 1
    assert older["spec"]["tasks"][0]["instruction"] == env["tasks"][0]["instruction"]
    assert await _registrations(settings, "versions") == [1, 2]


async def test_concurrent_pushes_each_get_their_own_version(
    registry: AsyncClient, settings: Settings
) -> None:
    env = refund_env(slug="racing")
    contents = [_with_instruction(env, f"Refund order R-{i}.") for i in range(6)]
    replies = await asyncio.gather(*(registry.push_environment(c) for c in contents))
    # Decided from the env's own history and appended expecting it unmoved: no version twice.
    assert sorted(r["version"] for r in replies) == [1, 2, 3, 4, 5, 6]
    assert len({r["spec_hash"] for r in replies}) == 6
    assert await _registrations(settings, "racing") == [1, 2, 3, 4, 5, 6]


async def test_an_invalid_spec_is_refused_by_path_and_records_nothing(
    registry: AsyncClient, settings: Settings
) -> None:
    env = refund_env(slug="broken")
    env["tasks"] = [{**env["tasks"][0], "hiddenGroundTruth": None, "instructionn": "typo"}]
    with pytest.raises(RolloutError) as caught:
        await registry.push_environment(env)
    assert "'broken' is invalid" in caught.value.message
    assert any(p.startswith("tasks[0].instructionn") for p in caught.value.problems)
    assert await _registrations(settings, "broken") == []
    with pytest.raises(RolloutError, match="no environment 'broken'; push it"):
        await registry.get_environment("broken")


async def test_an_unknown_version_is_a_clear_error(registry: AsyncClient) -> None:
    await registry.push_environment(refund_env(slug="one-version"))
    with pytest.raises(RolloutError, match="no version 7 of environment 'one-version'"):
        await registry.get_environment("one-version", 7)
