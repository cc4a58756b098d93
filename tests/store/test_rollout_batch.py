"""Projection batching (shared/store/rollout_batch.py): stream order, first occurrence wins."""

from __future__ import annotations

from typing import Any

from rollout.shared.contracts import events as ev
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.store.rollout_batch import RolloutBatch, apply_events, columns


def generated(n: int, *ids: str) -> EventEnvelope:
    rollouts = [
        ev.GeneratedRollout(rollout_id=i, task_index=0, sample_index=n, model="m") for i in ids
    ]
    body = ev.RolloutsGenerated(run_id="r", work_item_id=f"w{n}", rollouts=rollouts)
    return EventEnvelope.new(body, aggregate_id="r", id_parts=("g", n))


def scored(n: int, **scores: float) -> EventEnvelope:
    rollouts = [
        ev.ScoredRollout(rollout_id=i, task_index=0, sample_index=0, score=s, passed=s > 0.5)
        for i, s in scores.items()
    ]
    body = ev.RolloutsScored(run_id="r", work_item_id=f"w{n}", rollouts=rollouts)
    return EventEnvelope.new(body, aggregate_id="r", id_parts=("s", n))


def other(n: int) -> EventEnvelope:
    body = ev.RunCompleted(run_id="r", passed=0, total=0, pass_rate=0.0, mean_score=0.0)
    return EventEnvelope.new(body, aggregate_id="r", id_parts=("c", n))


async def test_rollout_events_batch_between_others_in_stream_order() -> None:
    applied: list[Any] = []

    async def flush(conn: Any, batch: RolloutBatch) -> None:
        gen = batch.generated_rows(lambda e, p, r, pos: (r.rollout_id, p.work_item_id, pos))
        ver = batch.scored_rows(lambda e, p, r, pos: (r.rollout_id, r.score, pos))
        applied.append(("batch", gen, ver))

    async def completed(conn: Any, e: EventEnvelope, p: Any, position: int) -> None:
        applied.append(("completed", position))

    items = [
        (generated(1, "a", "b"), 1),
        (generated(2, "a"), 2),  # a again: the first occurrence stays
        (scored(3, a=1.0), 3),
        (scored(4, a=0.0), 4),  # a second verdict: the first wins
        (generated(5, "a", "c"), 5),  # names a scored rollout: waits for the batch before it
        (other(6), 6),
        (generated(7, "d"), 7),
    ]
    await apply_events(None, items, handlers={"run.completed": completed}, flush=flush)  # type: ignore[arg-type]
    assert applied == [
        ("batch", [("a", "w1", 1), ("b", "w1", 1)], [("a", 1.0, 3)]),
        ("batch", [("a", "w5", 5), ("c", "w5", 5)], []),
        ("completed", 6),
        ("batch", [("d", "w7", 7)], []),
    ]


async def test_events_without_a_handler_are_skipped_without_splitting_a_batch() -> None:
    flushed: list[int] = []

    async def flush(conn: Any, batch: RolloutBatch) -> None:
        flushed.append(len(batch.generated))

    items = [(generated(1, "a"), 1), (other(2), 2), (generated(3, "b"), 3)]
    await apply_events(None, items, handlers={}, flush=flush)  # type: ignore[arg-type]
    assert flushed == [2]


def test_columns_are_unnest_arrays() -> None:
    assert columns([(1, "a"), (2, "b")], 2) == [[1, 2], ["a", "b"]]
