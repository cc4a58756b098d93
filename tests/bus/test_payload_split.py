"""Splitting a batch event by encoded size, and refusing one that cannot fit."""

from __future__ import annotations

import pytest

from rollout.shared.bus.publisher import EventPublisher, PayloadTooLarge, fit_to_payload
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts.events import GeneratedRollout, RolloutsGenerated


def rollout(i: int, size: int) -> GeneratedRollout:
    return GeneratedRollout(
        rollout_id=f"r{i}",
        task_index=0,
        sample_index=i,
        model="m",
        trajectory={"final_output": "z" * size},
    )


def build(items: list[GeneratedRollout], start: int, end: int) -> EventEnvelope:
    return EventEnvelope.new(
        RolloutsGenerated(run_id="run", work_item_id="w", rollouts=items),
        aggregate_id="run",
        id_parts=("w", start, end),
    )


def test_a_batch_over_the_budget_is_split_in_order_into_parts_that_fit() -> None:
    items = [rollout(i, 10_000) for i in range(16)]
    budget = 45_000
    events = fit_to_payload(items, build, budget)
    assert len(events) > 1
    assert all(len(e.to_bytes()) <= budget for e in events)
    carried = [r["rollout_id"] for e in events for r in e.payload["rollouts"]]
    assert carried == [f"r{i}" for i in range(16)]
    assert len({e.id for e in events}) == len(events)


def test_a_batch_that_fits_is_one_event() -> None:
    items = [rollout(i, 100) for i in range(4)]
    [event] = fit_to_payload(items, build, 1_000_000)
    assert len(event.payload["rollouts"]) == 4


def test_an_item_too_large_alone_is_shrunk_or_refused_with_the_sizes() -> None:
    items = [rollout(0, 100), rollout(1, 50_000), rollout(2, 100)]
    with pytest.raises(PayloadTooLarge, match=r"item 1 is \d+ bytes encoded, over the 20000"):
        fit_to_payload(items, build, 20_000)

    def drop(item: GeneratedRollout, size: int, budget: int) -> GeneratedRollout:
        return item.model_copy(update={"trajectory": None, "error": f"{size} > {budget}"})

    events = fit_to_payload(items, build, 20_000, shrink=drop)
    rollouts = [r for e in events for r in e.payload["rollouts"]]
    assert [r["rollout_id"] for r in rollouts] == ["r0", "r1", "r2"]
    assert rollouts[1]["trajectory"] is None and "> 20000" in rollouts[1]["error"]


async def test_publish_refuses_an_event_over_the_servers_max_payload(nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    big = build([rollout(0, nats_client.max_payload + 1)], 0, 1)
    with pytest.raises(PayloadTooLarge, match="bytes a message may carry on this server"):
        await EventPublisher(js).publish(big)
    results = await EventPublisher(js).publish_fitted(
        [rollout(i, 300_000) for i in range(8)], build
    )
    assert len(results) > 2 and not any(r.duplicate for r in results)


def test_with_group_by_a_split_falls_between_groups_not_inside_one() -> None:
    # Three tasks of two samples: the middle (item 3) is inside task 1's pair.
    items = [rollout(i, 10_000).model_copy(update={"task_index": i // 2}) for i in range(6)]
    events = fit_to_payload(items, build, 45_000, group_by=lambda r: r.task_index)
    parts = [[r["task_index"] for r in e.payload["rollouts"]] for e in events]
    assert len(parts) > 1 and sum(parts, []) == [0, 0, 1, 1, 2, 2]
    for part in parts:
        assert all(part.count(t) == 2 for t in set(part)), parts
    # Without it, the halving cuts a task's samples apart (what the option is for).
    halves = fit_to_payload(items, build, 45_000)
    assert any([r["task_index"] for r in e.payload["rollouts"]].count(1) == 1 for e in halves)


async def test_a_request_over_the_servers_max_payload_is_refused_with_its_size(
    nats_settings,
) -> None:
    # `rollout push` of an env with 20 MB of fixtures printed nats' MaxPayloadError as a
    # traceback; it says now how large the env is and what the server takes.
    from rollout import Environment, Task
    from rollout.client import AsyncClient
    from rollout.errors import RolloutError
    from rollout.shared.bus.requests import RequestTooLarge, call
    from rollout.shared.contracts.requests import GetEnvironment

    client = AsyncClient(nats_settings, timeout_s=5)
    try:
        nc = await client._conn()
        request = GetEnvironment(slug="x" * (nc.max_payload + 1))
        with pytest.raises(RequestTooLarge, match=r"over the 1,048,576 the server accepts"):
            await call(nc, "rollout.req.registry.get", request)
        env = Environment(
            slug="huge",
            template="workflow",
            config={"fixtures": {"blob": "x" * nc.max_payload}},
            tasks=[Task(instruction="look", hidden_ground_truth={})],
        )
        with pytest.raises(RolloutError) as err:
            await client.push_environment(env)
        assert str(err.value).startswith("environment 'huge' is too large to push: 1,048,")
        assert "bytes as JSON, over the 1,048,576 the server accepts in one message" in str(
            err.value
        )
    finally:
        await client.close()
