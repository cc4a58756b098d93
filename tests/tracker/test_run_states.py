"""The leader's run aggregates folded from the projected events: the loaded state, no reads.

Real NATS and Postgres. A run's history is appended by hand (requested, started, generated,
verdicts with a repeat and one for a rollout the run never planned), projected with the
tracker's read models, and folded as the projection would fold it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import nats.aio.client
import pytest

from rollout.services.tracker import runs
from rollout.services.tracker.projections import ReadModels
from rollout.shared import subjects
from rollout.shared.aggregates.run import RunState, load_run, rollout_id
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import EventEnvelope
from rollout.shared.contracts import events as ev
from rollout.shared.settings import Settings
from rollout.shared.store.db import close_pool, create_pool, migrate
from rollout.shared.store.projection import ProjectionRunner

RUN = "folded-run"
PLANNED = [(t, s) for t in (0, 1) for s in (0, 1)]


def _event(payload: ev.Payload, *parts: object) -> EventEnvelope:
    return EventEnvelope.new(payload, aggregate_id=RUN, id_parts=(RUN, *parts), run_id=RUN)


def _scored(index: int, verdicts: list[tuple[str, float, bool]]) -> EventEnvelope:
    rollouts = [
        ev.ScoredRollout(rollout_id=rid, task_index=0, sample_index=0, score=s, passed=p)
        for rid, s, p in verdicts
    ]
    return _event(ev.RolloutsScored(run_id=RUN, work_item_id=f"w{index}", rollouts=rollouts), index)


def _generated(index: int, pairs: list[tuple[int, int]]) -> EventEnvelope:
    rollouts = [
        ev.GeneratedRollout(
            rollout_id=rollout_id(RUN, t, s), task_index=t, sample_index=s, model="m", seed=1
        )
        for t, s in pairs
    ]
    return _event(
        ev.RolloutsGenerated(run_id=RUN, work_item_id=f"w{index}", rollouts=rollouts), index
    )


def history(scored_all: bool = True) -> list[EventEnvelope]:
    """Requested, started, generated, verdicts (one repeated, one not planned)."""
    ids = [rollout_id(RUN, t, s) for t, s in PLANNED]
    requested = ev.RunRequested(
        run_id=RUN, env_slug="refunds", env_version=1, env_hash="h", model="m", n=2,
        task_indices=[0, 1],
    )  # fmt: skip
    events = [
        _event(requested),
        _event(ev.RunStarted(run_id=RUN, work_items=2, total_rollouts=4)),
        _generated(0, PLANNED[:2]),
        _scored(0, [(ids[0], 1.0, True), (ids[1], 0.0, False), ("not-planned", 1.0, True)]),
        _scored(1, [(ids[0], 0.0, False)]),  # a repeat: the first verdict stays
        _generated(1, PLANNED[2:]),
    ]
    if scored_all:
        events.append(_scored(2, [(ids[2], 1.0, True), (ids[3], 0.5, False)]))
    return events


async def _append(js, events: list[EventEnvelope]) -> None:  # type: ignore[no-untyped-def]
    publisher = EventPublisher(js)
    for event in events:
        await publisher.publish(event)


async def _log(js) -> list[tuple[EventEnvelope, int]]:  # type: ignore[no-untyped-def]
    return [
        (EventEnvelope.from_bytes(m.data), m.metadata.sequence.stream)
        async for m in read_events(js, subjects.run_events(RUN))
    ]


def _stored(items: list[tuple[EventEnvelope, int]]) -> list[tuple[str, EventEnvelope, int]]:
    """(subject, event, position) as the projection folds them (our events' own subjects)."""
    return [(e.subject, e, seq) for e, seq in items]


async def _endings(js) -> list[str]:  # type: ignore[no-untyped-def]
    return [e.type for e, _ in await _log(js) if e.type in ("run.completed", "run.failed")]


async def _projected(pool: asyncpg.Pool, items: list[tuple[EventEnvelope, int]]) -> None:
    await ProjectionRunner(pool, ReadModels()).handle_batch(list(items))


async def test_the_folded_state_is_the_loaded_state(
    nats_client: nats.aio.client.Client,
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    await _append(js, history())
    states = runs.RunStates()
    states.fold(_stored(await _log(js)))
    folded, loaded = states.get(RUN), await load_run(js, RUN)
    assert folded is not None
    assert (folded.version, folded.total, folded.planned) == (
        loaded.version,
        loaded.total,
        loaded.planned,
    )
    assert folded.verdicts == loaded.verdicts
    assert len(folded.verdicts) == 4 and folded.verdicts[rollout_id(RUN, 0, 0)].passed


async def test_a_run_completes_once_from_its_folded_state(
    nats_client: nats.aio.client.Client, settings: Settings
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        states = runs.RunStates()
        await _append(js, history(scored_all=False))
        states.fold(_stored(await _log(js)))
        assert not await states.complete_if_done(js, pool, RUN)  # 2 of 4 still unscored
        await _append(js, history()[-1:])
        states.fold(_stored((await _log(js))[-1:]))
        assert await states.complete_if_done(js, pool, RUN)
        assert await _endings(js) == ["run.completed"]
        completed = next(e for e, _ in await _log(js) if e.type == "run.completed").body()
        assert isinstance(completed, ev.RunCompleted)
        assert (completed.total, completed.passed) == (4, 2)
        assert completed.mean_score == (1.0 + 0.0 + 1.0 + 0.5) / 4
        # Its ending folded, the run is no longer kept; a late trigger ends nothing again.
        states.fold(_stored((await _log(js))[-1:]))
        assert states.get(RUN) is None
        await _projected(pool, await _log(js))
        assert not await states.complete_if_done(js, pool, RUN)
        assert await _endings(js) == ["run.completed"]
    finally:
        await close_pool(pool)


async def test_a_history_that_moved_past_the_fold_is_decided_from_a_load(
    nats_client: nats.aio.client.Client, settings: Settings
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        await _append(js, history())
        states = runs.RunStates()
        states.fold(_stored(await _log(js)))
        folded_version = states.get(RUN).version  # type: ignore[union-attr]
        # A verdict lands that the fold has not seen: the append from the fold is refused.
        await _append(js, [_scored(9, [(rollout_id(RUN, 1, 1), 1.0, True)])])
        assert await states.complete_if_done(js, pool, RUN)
        log = await _log(js)
        assert await _endings(js) == ["run.completed"]
        ending = next(seq for e, seq in log if e.type == "run.completed")
        assert ending > folded_version + 1  # appended after the verdict it had not folded
    finally:
        await close_pool(pool)


async def test_a_run_not_seen_from_its_start_is_loaded_once(
    nats_client: nats.aio.client.Client, settings: Settings
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        await _append(js, history())
        log = await _log(js)
        await _projected(pool, log)
        states = runs.RunStates()
        states.fold(_stored(log[3:]))  # a leader that took over mid-run: no requested folded
        assert states.get(RUN) is None
        assert await states.complete_if_done(js, pool, RUN)
        assert await _endings(js) == ["run.completed"]
    finally:
        await close_pool(pool)


async def test_events_of_a_run_never_requested_cost_no_decision(
    nats_client: nats.aio.client.Client, settings: Settings
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    pool = await create_pool(settings.database_url)
    try:
        await migrate(pool)
        events = history()[2:]  # verdicts with no run.requested before them
        await _append(js, events)
        log = await _log(js)
        await _projected(pool, log)
        states = runs.RunStates()
        states.fold(_stored(log))
        assert not await states.complete_if_done(js, pool, RUN)
        kept = states.get(RUN)
        assert kept is not None and kept.requested is None  # kept: the next batch reads nothing
        assert await _endings(js) == []
    finally:
        await close_pool(pool)


async def _requested_at(js) -> tuple[EventEnvelope, int]:  # type: ignore[no-untyped-def]
    event = history()[0]
    result = await EventPublisher(js).publish(event, expected_last_subject_seq=0)
    return event, result.seq


async def _types(js) -> list[str]:  # type: ignore[no-untyped-def]
    return [e.type for e, _ in await _log(js)]


async def test_a_fresh_run_is_started_from_its_request_alone(
    nats_client: nats.aio.client.Client,
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    event, seq = await _requested_at(js)
    started = await runs.fan_out(js, event, seq)
    assert started is not None and started.total_rollouts == 4
    # A redelivered request: the history moved past it, so it is looked at, not started again.
    again = await runs.fan_out(js, event, seq)
    assert again is not None
    assert await _types(js) == ["run.requested", "run.started"]
    info = await js.stream_info(subjects.WORK_STREAM)
    assert info.state.messages == 1  # 4 rollouts in one work item of 16 (the default), once
    state = await load_run(js, RUN)
    assert state.total == 4 and state.version == seq + 1


async def test_a_run_that_ended_before_its_fan_out_is_not_started(
    nats_client: nats.aio.client.Client,
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    event, seq = await _requested_at(js)
    await runs.append_to_run(js, await load_run(js, RUN), ev.RunFailed(run_id=RUN, reason="x"))
    assert await runs.fan_out(js, event, seq) is None
    assert await _types(js) == ["run.requested", "run.failed"]
    assert (await js.stream_info(subjects.WORK_STREAM)).state.messages == 0


def test_the_stored_subject_names_the_run_not_the_envelopes_claim() -> None:
    states = runs.RunStates()
    events = history(scored_all=False)[:2]
    states.fold(_stored(list(zip(events, (1, 2), strict=True))))
    verdict = _scored(5, [(rollout_id(RUN, 1, 1), 1.0, True)])
    # Stored under another run's subject while its envelope claims this run: not this run's.
    other = subjects.event("run", "other-run", subjects.event_name("rollout.scored"))
    states.fold([(other, verdict, 3)])
    state = states.get(RUN)
    assert state is not None and state.verdicts == {} and state.version == 2
    states.fold([(verdict.subject, verdict, 4)])
    assert list(state.verdicts) == [rollout_id(RUN, 1, 1)] and state.version == 4


async def test_a_run_whose_every_rollout_errored_fails_saying_why(
    nats_client: nats.aio.client.Client, settings: Settings
) -> None:
    """All scored and none with a verdict (a model server that is down): its 0% would measure
    the error, so the run fails, with the first rollout's error, once."""
    js = nats_client.jetstream()
    await ensure_streams(js)
    pool = await create_pool(settings.database_url)
    events = history(scored_all=False)[:3] + [_generated(1, PLANNED[2:])]
    errors = [
        ev.ScoredRollout(
            rollout_id=rollout_id(RUN, t, s), task_index=t, sample_index=s, score=0.0,
            passed=False, error=f"cannot reach the model (task {t})\ntraceback", error_kind="model",
        )
        for t, s in reversed(PLANNED)  # the first in task order is reported, not the first seen
    ]  # fmt: skip
    events.append(_event(ev.RolloutsScored(run_id=RUN, work_item_id="w", rollouts=errors), "e"))
    try:
        await migrate(pool)
        states = runs.RunStates()
        await _append(js, events)
        states.fold(_stored(await _log(js)))
        assert await states.complete_if_done(js, pool, RUN)
        assert await _endings(js) == ["run.failed"]
        failed = next(e for e, _ in await _log(js) if e.type == "run.failed").body()
        assert isinstance(failed, ev.RunFailed) and failed.cause == "errored"
        assert failed.reason == (
            "every rollout errored (4 of 4), so nothing was measured; the first: task 0"
            " (model error): cannot reach the model (task 0)"
        )
        await _projected(pool, await _log(js))
        async with pool.acquire() as conn:
            row = await conn.fetchrow("select status, reason from runs where run_id = $1", RUN)
        assert (row["status"], row["reason"]) == ("failed", failed.reason)
        # One error among verdicts is a measured run: it completes.
        state = await load_run(js, RUN)
        state.ended = None
        state.verdicts[rollout_id(RUN, 1, 1)] = ev.ScoredRollout(
            rollout_id=rollout_id(RUN, 1, 1), task_index=1, sample_index=1, score=1.0, passed=True
        )
        assert isinstance(state.decide(datetime.now(UTC)), ev.RunCompleted)
    finally:
        await close_pool(pool)


def test_a_twins_verdict_gives_way_to_the_verdict_of_the_trajectory_the_read_models_keep() -> None:
    """A rollout generated twice: the twin's verdict (a pass) lands first, the first
    trajectory's (a fail) after; the run counts the one the buffer and read model keep."""
    from rollout.shared.aggregates.run import RunState

    state = RunState(RUN)
    requested = ev.RunRequested(
        run_id=RUN, env_slug="refunds", env_version=1, env_hash="h", model="m", n=1,
        task_indices=[0],
    )  # fmt: skip
    state.apply(_event(requested), 1)
    state.apply(_event(ev.RunStarted(run_id=RUN, work_items=1, total_rollouts=1)), 2)
    rid = rollout_id(RUN, 0, 0)

    def verdict(passed: bool, judged: int | None, tag: str) -> EventEnvelope:
        r = ev.ScoredRollout(rollout_id=rid, task_index=0, sample_index=0,
                             score=float(passed), passed=passed)  # fmt: skip
        return _event(ev.RolloutsScored(run_id=RUN, work_item_id="w", rollouts=[r],
                                        generated_seq=judged), tag)  # fmt: skip

    state.apply(verdict(True, 4, "twin"), 6)  # the twin's trajectory is at 4, the first at 3
    assert state.verdicts[rid].passed
    state.apply(verdict(False, 3, "first"), 7)
    assert not state.verdicts[rid].passed and state.judged[rid] == 3
    state.apply(verdict(True, 4, "twin-again"), 8)  # a redelivered twin changes nothing
    assert not state.verdicts[rid].passed
    state.apply(verdict(True, None, "old"), 9)  # nor a verdict naming no trajectory
    assert not state.verdicts[rid].passed


def _big_request(run_id: str = RUN, owner: str | None = "u") -> EventEnvelope:
    requested = ev.RunRequested(
        run_id=run_id, env_slug="refunds", env_version=1, env_hash="h", model="m", n=8,
        task_indices=list(range(8)), batch_size=2, owner=owner,
    )  # fmt: skip
    return EventEnvelope.new(requested, aggregate_id=run_id, id_parts=(run_id,), run_id=run_id)


async def test_a_redelivered_fan_out_keeps_the_window_its_history_records(
    nats_client: nats.aio.client.Client,
) -> None:
    # A redelivery met another share (another leader, another setting): it must queue and
    # report the recorded window, or items between the two are never queued.
    js = nats_client.jetstream()
    await ensure_streams(js)
    event = _big_request()
    seq = (await EventPublisher(js).publish(event, expected_last_subject_seq=0)).seq
    first = await runs.fan_out(js, event, seq, share=8)  # 4 items of 2 rollouts
    assert first is not None and (first.work_items, first.window) == (32, 4)
    again = await runs.fan_out(js, event, seq, share=32)
    assert again is not None and again.window == 4
    assert (await js.stream_info(subjects.WORK_STREAM)).state.messages == 4
    states = runs.RunStates()
    states.fold(_stored(await _log(js)))
    state = states.get(RUN)
    assert state is not None and (state.window, state.released) == (4, 4)


def test_slices_of_a_run_draw_each_seed_once_and_match_the_whole() -> None:
    event = _big_request()
    run = event.body()
    whole = runs.work_items(event, run)
    seeds = runs.Seeds(run)
    sliced = [w for a in range(0, 32, 3) for w in runs.work_items(event, run, a, a + 3, seeds)]
    assert sliced == whole
    assert runs.work_items(event, run, 5, 7, seeds) == whole[5:7]  # an earlier slice again


def test_runs_fanned_out_together_split_their_owners_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fetch's requests are handled concurrently: each reserves before its first await.
    monkeypatch.setenv(runs.RUN_WINDOW_ENV, "12")
    states = runs.RunStates()
    shares = [states.reserve(_big_request(f"r{i}")) for i in range(3)]
    assert shares == [12, 6, 4]
    assert states.reserve(_big_request("other", owner="v")) == 12


def test_a_run_that_ended_while_fanned_out_no_longer_counts_in_its_owners_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(runs.RUN_WINDOW_ENV, "12")
    states = runs.RunStates()
    request = _big_request()
    started = ev.RunStarted(run_id=RUN, work_items=32, total_rollouts=64, window=6)
    states.reserve(request)
    ended = _event(ev.RunFailed(run_id=RUN, reason="cancelled", cause="cancelled"))
    states.fold(_stored([(request, 1), (_event(started), 2), (ended, 3)]))
    assert states.get(RUN) is None and len(states) == 0
    assert states.owner_share("u", "next") == 12  # nothing of it is counted any more


def test_an_owners_runs_past_the_cap_wait_and_start_first_come_first_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two runs of u may be under way; a third and a fourth wait (share 0), another owner does
    # not. As u's first run ends, its oldest waiting run (not the newest) may start.
    monkeypatch.setenv(runs.RUN_WINDOW_ENV, "12")
    monkeypatch.setenv(runs.RUNS_PER_OWNER_ENV, "2")
    states = runs.RunStates()
    requests = [_big_request(f"r{i}") for i in range(4)]
    shares = [states.reserve(r) for r in requests]
    assert shares == [12, 6, 0, 0]
    assert states.reserve(_big_request("other", owner="v")) == 12
    history = []
    for i, (request, share) in enumerate(zip(requests, shares, strict=True)):
        window = runs.window_items(share, 2, 32)
        started = ev.RunStarted(run_id=f"r{i}", work_items=32, total_rollouts=64, window=window)
        history += [request, _event_of(f"r{i}", started)]
    states.fold(_stored([(e, i) for i, e in enumerate(history, start=1)]))
    waiting = [states.get(f"r{i}") for i in (2, 3)]
    assert all(w is not None and w.waiting and w.deadline is None for w in waiting)
    assert (states.owner_share("u", "r2"), states.owner_share("u", "r3")) == (0, 0)
    assert states.owner_share("u", "r0") == 6  # one under way never waits
    ended = _event_of("r0", ev.RunFailed(run_id="r0", reason="cancelled", cause="cancelled"))
    states.fold(_stored([(ended, len(history) + 1)]))
    assert (states.owner_share("u", "r2"), states.owner_share("u", "r3")) == (6, 0)


def test_a_waiting_runs_deadline_counts_from_its_first_release() -> None:
    request = _big_request()
    state = RunState(RUN)
    state.apply(request, 1)
    state.apply(_event(ev.RunStarted(run_id=RUN, work_items=32, total_rollouts=64, window=0)), 2)
    assert state.waiting and state.deadline is None
    far = datetime(2999, 1, 1, tzinfo=UTC)
    assert state.decide(far) is None  # no deadline passes while it waits
    released = _event(ev.WorkReleased(run_id=RUN, released=4), "released")
    state.apply(released, 3)
    assert not state.waiting and state.released == 4
    assert state.deadline == released.time + timedelta(seconds=request.body().deadline_s)
    assert isinstance(state.decide(far), ev.RunFailed)


def _event_of(run_id: str, payload: ev.Payload) -> EventEnvelope:
    return EventEnvelope.new(payload, aggregate_id=run_id, id_parts=(run_id, payload.event_type))
