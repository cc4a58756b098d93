"""A run keeps at most its window of work items in the shared queue, so another run (anyone's)
is not stuck behind its whole backlog; the rest is queued as earlier items are scored, and
every rollout is still generated and scored exactly once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAI
from pipeline.kit import Platform, refund_env
from waiting import wait_until

from rollout.cli._common import shown_status
from rollout.cli.platform import print_run
from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.tracker.runs import RUN_WINDOW_ENV, RUNS_PER_OWNER_ENV, window_items
from rollout.services.ui.events import describe
from rollout.shared import subjects
from rollout.shared.aggregates.run import RunState, follow_run, load_run, load_run_head
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import (
    RolloutsGenerated,
    RunRequested,
    RunStarted,
    WorkReleased,
)
from rollout.shared.replay import replay_run


async def _queued(js: Any) -> int:
    info = await js.consumer_info(subjects.WORK_STREAM, "actors")
    return info.num_pending + info.num_ack_pending


async def _completed(client: AsyncClient, run_id: str) -> bool:
    try:
        return (await client.get_run(run_id))["status"] == "completed"
    except RolloutError:  # a tracker (re)starting answers nothing yet
        return False


async def _head(js: Any, run_id: str) -> Any:
    """The run's head once it has fanned out (None before)."""
    found = await load_run_head(js, run_id)
    return found if found is not None and found.total is not None else None


async def _started(
    client: AsyncClient, js: Any, model: str, owner: str | None = None
) -> tuple[str, int | None]:
    """A run of 2 rollouts per task in items of one, once fanned out: (its id, its window)."""
    run_id = (await client.create_run("refunds", model, n=2, batch_size=1, owner=owner))["runId"]
    head = await wait_until(lambda: _head(js, run_id), f"{owner or 'the'}'s run fanned out", 30)
    return run_id, head.window


async def _all_completed(client: AsyncClient, run_ids: list[str], rollouts: int) -> None:
    """Each run completes with every rollout generated and scored once."""
    for run_id in run_ids:
        await wait_until(lambda r=run_id: _completed(client, r), "the runs completed", 120)
        done = await client.get_run(run_id)
        assert (done["generated"], done["scored"]) == (rollouts, rollouts), done


async def test_a_big_run_queues_its_window_and_the_rest_as_items_are_scored(
    actorless: tuple[Platform, AsyncClient, Any],
    agent_server: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    platform, client, js = actorless
    monkeypatch.setenv(RUN_WINDOW_ENV, "3")
    await client.push_environment(refund_env(tasks=6))
    run = await client.create_run("refunds", f"{agent_server.base_url}#m", n=2, batch_size=1)
    run_id = run["runId"]
    head = await wait_until(lambda: _head(js, run_id), "the run fanned out", 30)
    assert (head.work_items, head.window, head.total) == (12, 3, 12)
    await wait_until(lambda: _queued_is(js, 3), "the run's window queued", 30)

    platform.start("actor")
    await wait_until(lambda: _completed(client, run_id), "the run completed", 90)
    done = await client.get_run(run_id)
    assert (done["generated"], done["scored"]) == (12, 12), done
    assert await _queued(js) == 0
    replayed = await replay_run(js, run_id)
    assert len(replayed.generated) == len(replayed.scored) == 12
    # Released one item at a time as each was scored, in order, up to all 12.
    released = [
        e.body().released
        async for e in _events(
            js, subjects.event("run", run_id, subjects.event_name(WorkReleased.event_type))
        )
        if isinstance(e.body(), WorkReleased)
    ]
    assert released == sorted(released) and released[-1] == 12 and released[0] > 3, released
    state = await load_run(js, run_id)
    assert state.released == 12 and state.to_release() is None


async def _queued_is(js: Any, count: int) -> bool:
    return await _queued(js) == count


async def _events(js: Any, subject: str):  # type: ignore[no-untyped-def]
    async for msg in read_events(js, subject):
        yield EventEnvelope.from_bytes(msg.data)


@pytest.mark.parametrize(("window", "ahead_at_most"), [("2", 2), ("0", 24)])
async def test_a_small_run_is_not_stuck_behind_a_big_runs_backlog(
    actorless: tuple[Platform, AsyncClient, Any],
    agent_server: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    window: str,
    ahead_at_most: int,
) -> None:
    # One actor taking one item at a time: the order it generates in is the queue's order.
    platform, client, js = actorless
    monkeypatch.setenv(RUN_WINDOW_ENV, window)
    monkeypatch.setenv("ROLLOUT_ACTOR_CONCURRENCY", "1")
    await client.push_environment(refund_env(tasks=6))
    await client.push_environment(refund_env(tasks=1, slug="small"))
    model = f"{agent_server.base_url}#m"
    big = (await client.create_run("refunds", model, n=4, batch_size=1))["runId"]
    queued_big = 2 if window == "2" else 24
    await wait_until(lambda: _queued_is(js, queued_big), "the big run queued", 30)
    small = (await client.create_run("small", model, n=1))["runId"]
    await wait_until(lambda: _queued_is(js, queued_big + 1), "the small run queued", 30)

    platform.start("actor")
    await wait_until(lambda: _completed(client, small), "the small run completed", 90)
    await wait_until(lambda: _completed(client, big), "the big run completed", 120)
    # How many of the big run's rollouts were generated before the small run's one.
    order = [
        e.body().run_id
        async for e in _events(js, subjects.event_filter("run", "rollout.generated"))
        if isinstance(e.body(), RolloutsGenerated)
    ]
    assert sorted(set(order)) == sorted({big, small}) and order.count(small) == 1
    ahead = order.index(small)
    if window == "0":
        assert ahead == ahead_at_most  # the old first come, first served: the whole backlog
    else:
        assert ahead <= ahead_at_most, order
    done = await client.get_run(big)
    assert (done["generated"], done["scored"]) == (24, 24)


async def test_a_new_tracker_goes_on_releasing_from_the_runs_history(
    actorless: tuple[Platform, AsyncClient, Any],
    agent_server: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    platform, client, js = actorless
    monkeypatch.setenv(RUN_WINDOW_ENV, "2")
    await client.push_environment(refund_env(tasks=5))
    run_id = (await client.create_run("refunds", f"{agent_server.base_url}#m", n=2, batch_size=1))[
        "runId"
    ]
    await wait_until(lambda: _queued_is(js, 2), "the run's window queued", 30)
    # The tracker goes away with the window queued: nothing releases the rest meanwhile.
    await platform.stop("tracker")
    platform.start("actor")
    await wait_until(lambda: _queued_is(js, 0), "the window generated", 60)
    head = await load_run_head(js, run_id)
    assert head is not None and head.ended is None
    # A new tracker reads what was released from the run's history and goes on from there.
    platform.start("tracker")
    await wait_until(lambda: _completed(client, run_id), "the run completed", 90)
    done = await client.get_run(run_id)
    assert (done["generated"], done["scored"]) == (10, 10), done
    replayed = await replay_run(js, run_id)
    assert len(replayed.generated) == len(replayed.scored) == 10


def test_the_window_is_whole_items_of_the_rollouts_asked_for() -> None:
    assert window_items(256, 16, 100) == 16
    assert window_items(256, 1, 1000) == 256
    assert window_items(100, 64, 10) == 2  # rounded up to whole items
    assert window_items(8, 64, 10) == 1  # at least one
    assert window_items(256, 16, 16) is None  # the run fits: all queued at once
    assert window_items(None, 16, 100) is None


def test_items_are_released_a_quarter_window_at_a_time_and_the_last_whatever_their_number() -> None:
    requested = RunRequested(
        run_id="r", env_slug="e", env_version=1, env_hash="h", model="m", n=1,
        task_indices=list(range(10)), batch_size=1,
    )  # fmt: skip
    state = RunState("r", requested=requested)
    state.start(RunStarted(run_id="r", work_items=10, total_rollouts=10, window=8))
    assert (state.released, state.to_release()) == (8, None)
    score = iter(range(10))

    def scored(count: int) -> int | None:
        for _ in range(count):
            i = next(score)
            state.verdicts[f"x{i}"] = None  # type: ignore[assignment]
        return state.to_release()

    assert scored(1) is None  # one item's worth: under a quarter of the window
    assert scored(1) == 10  # two: due 10, the last items, released
    state.released = 10
    assert scored(3) is None


def test_the_viewer_says_what_the_window_did() -> None:
    started = RunStarted(run_id="r", work_items=40, total_rollouts=640, window=16)
    assert describe(started.model_dump(), "run.started") == (
        "640 rollouts in 40 work items, 16 queued at a time"
    )
    whole = RunStarted(run_id="r", work_items=4, total_rollouts=64)
    assert describe(whole.model_dump(), "run.started") == "64 rollouts in 4 work items"
    waits = RunStarted(run_id="r", work_items=40, total_rollouts=640, window=0)
    assert describe(waits.model_dump(), "run.started") == (
        "640 rollouts in 40 work items, waiting for its owner's earlier runs"
    )
    released = WorkReleased(run_id="r", released=20)
    assert describe(released.model_dump(), "run.work_released") == "work items queued up to 20"


async def test_one_owners_runs_share_one_window_and_another_owner_has_its_own(
    actorless: tuple[Platform, AsyncClient, Any],
    agent_server: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The admin here starts runs for two users, as a job does for its owner.
    platform, client, js = actorless
    monkeypatch.setenv(RUN_WINDOW_ENV, "4")
    await client.push_environment(refund_env(tasks=6))
    model = f"{agent_server.base_url}#m"

    runs = [await _started(client, js, model, owner) for owner in ("alice", "alice", "bob")]
    # Alice's second run gets half of her window, and her first one's next releases too;
    # Bob's run, started after both, still has a whole window of its own.
    assert [window for _, window in runs] == [4, 2, 4]
    await wait_until(lambda: _queued_is(js, 10), "4 + 2 + 4 items queued", 30)
    platform.start("actor")
    await _all_completed(client, [run_id for run_id, _ in runs], 12)


async def _first_position(js: Any, run_id: str, event_type: str) -> int:
    subject = subjects.event("run", run_id, subjects.event_name(event_type))
    async for msg in read_events(js, subject):
        return msg.metadata.sequence.stream
    raise AssertionError(f"no {event_type} of {run_id}")


async def test_an_owners_runs_past_the_cap_wait_for_its_earlier_ones(
    actorless: tuple[Platform, AsyncClient, Any],
    agent_server: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One run of a key under way at a time: alice's second run queues nothing until her first
    # ends; bob's run is not held by hers.
    platform, client, js = actorless
    monkeypatch.setenv(RUN_WINDOW_ENV, "4")
    monkeypatch.setenv(RUNS_PER_OWNER_ENV, "1")
    await client.push_environment(refund_env(tasks=6))
    model = f"{agent_server.base_url}#m"

    runs = [await _started(client, js, model, owner) for owner in ("alice", "alice", "bob")]
    assert [window for _, window in runs] == [4, 0, 4]
    (first, _), (second, _), (third, _) = runs
    await wait_until(lambda: _queued_is(js, 8), "alice's first and bob's windows queued", 30)

    async def projected() -> dict[str, Any] | None:
        # The read model follows the log: under load its row may come a moment later, and its
        # start (the run's total, whether it waits) after the row itself.
        try:
            row = await client.get_run(second)
        except RolloutError:
            return None
        return row if row["total"] else None

    waiting = await wait_until(projected, "the waiting run in the read model", 30)
    assert (waiting["status"], waiting["waiting"], waiting["total"]) == ("queued", True, 12)
    assert shown_status(waiting) == "waiting"  # as `rollout runs` lists it
    capsys.readouterr()
    print_run({**waiting, "tasks": []})
    # The in-process services log to stdout too: the run's lines are the two in a row.
    shown = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(shown) if line.startswith(f"run {second}"))
    assert shown[at].startswith(f"run {second}  waiting  refunds"), shown
    assert "waits for its owner's earlier runs" in shown[at + 1], shown
    # A waiter's timeout counts from the run's start, not while it waits: past its 1 s (no
    # actor runs yet, so the run cannot start), neither way of waiting has given up.
    waiters = {
        asyncio.ensure_future(client.wait_for_run(second, timeout_s=1)),
        asyncio.ensure_future(follow_run(js, second, timeout_s=1)),
    }
    finished, _ = await asyncio.wait(waiters, timeout=2.5)
    assert not finished, [w.exception() for w in finished]
    for waiter in waiters:
        waiter.cancel()
    platform.start("actor")
    await _all_completed(client, [first, second, third], 12)
    # Alice's second run queued its first items only after her first ended.
    assert not (await client.get_run(second))["waiting"]
    first_end = await _first_position(js, first, "run.completed")
    second_go = await _first_position(js, second, WorkReleased.event_type)
    assert second_go > first_end


async def test_a_new_tracker_starts_a_waiting_run_it_never_saw_requested(
    actorless: tuple[Platform, AsyncClient, Any],
    agent_server: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The waiting run gets no verdict that would make a new leader load it: the leader finds
    # it in the read model once its owner's first run ends.
    platform, client, js = actorless
    monkeypatch.setenv(RUN_WINDOW_ENV, "2")
    monkeypatch.setenv(RUNS_PER_OWNER_ENV, "1")
    await client.push_environment(refund_env(tasks=3))
    model = f"{agent_server.base_url}#m"
    first, _ = await _started(client, js, model)
    second, window = await _started(client, js, model)
    assert window == 0
    await wait_until(lambda: _queued_is(js, 2), "the first run's window queued", 30)
    await platform.stop("tracker")
    platform.start("tracker")
    platform.start("actor")
    await _all_completed(client, [first, second], 6)
