"""The env registry on real NATS: versions decided from the env's own events, appended once."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from envs.env_mutants import mutants, problem_faults
from pipeline.kit import Platform, refund_env
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts import EventEnvelope
from rollout.shared.envs import validate_environment
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


async def test_mutated_specs_pushed_over_nats_are_refused_as_plan_refuses_them(
    registry: AsyncClient,
) -> None:
    # What the API is sent (a dict, as a script or another service sends it) is answered as
    # `rollout plan` answers it: registered, or refused with the same problems by path. A NaN
    # was sent as null: a budget of NaN seconds was registered as no budget at all.
    found = []
    for label, raw in mutants(seed=3, n=40):
        local = validate_environment(copy.deepcopy(raw))
        try:
            reply = await registry.push_environment(raw)
        except RolloutError as exc:
            if not local:
                found.append(f"{label}: plan accepts it, the registry says {exc} {exc.problems}")
            elif "cannot be sent as JSON" in exc.message:
                pass  # the client's own refusal (a NaN, too deep): its problems have paths too
            elif exc.problems[: len(local)] != local[: len(exc.problems)]:
                found.append(f"{label}: plan says {local[:3]}, the registry {exc.problems[:3]}")
            found += [f"{label}: {f}" for f in problem_faults(exc.problems, raw)]
            continue
        if local:
            found.append(f"{label}: registered as v{reply['version']}, plan says {local[:3]}")
    assert not found, found[:5]


async def test_a_spec_json_cannot_carry_is_refused_before_it_is_sent(
    registry: AsyncClient,
) -> None:
    # A NaN went out as null (this one was registered with an amount of null, so no refund
    # could match it); a spec nested 300 deep raised pydantic's serialization error.
    env = refund_env(slug="not-json")
    env["tasks"][1]["hiddenGroundTruth"]["refunds"][0]["amount"] = float("nan")
    with pytest.raises(RolloutError) as err:
        await registry.push_environment(env)
    assert err.value.message == "environment 'not-json' cannot be sent as JSON"
    assert err.value.problems == [
        "tasks[1].hiddenGroundTruth.refunds[0].amount: nan is not a finite number "
        "(JSON has no NaN or inf)"
    ]
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    env = refund_env(slug="not-json")
    env["config"]["fixtures"]["orders"]["O-1"]["notes"] = deep
    with pytest.raises(RolloutError) as err:
        await registry.push_environment(env)
    # Where the 64th level is: config, fixtures, orders, O-1, notes and 59 lists.
    assert err.value.problems == [
        "config.fixtures.orders.O-1.notes" + "[0]" * 59 + ": nested deeper than 64 levels of "
        "lists and objects (a spec is JSON that services store and read back: flatten it)"
    ]
    with pytest.raises(RolloutError, match="no environment 'not-json'"):
        await registry.get_environment("not-json")
