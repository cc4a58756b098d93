"""Episodes of one batch sharing a host (episodes_per_host > 1): one message per turn; when a
plugin kills that host, its partners are replayed on hosts of their own and go on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from host_plugins import STEP_TIMEOUT_S, spec

from rollout.shared.agent.loop import Episode, run_episodes
from rollout.shared.envs.engine import start_runtimes
from rollout.shared.envs.plugin_host import client
from rollout.shared.envs.plugin_host.client import HostPool, HostSettings
from rollout.shared.learning.scripted import ScriptedBackend

PLAN = [("go", {}), ("go", {})]


def _pool(monkeypatch: pytest.MonkeyPatch, per_host: int) -> Iterator[HostPool]:
    fresh = HostPool(
        HostSettings(step_timeout_s=STEP_TIMEOUT_S, start_timeout_s=5.0, episodes_per_host=per_host)
    )
    monkeypatch.setattr(client, "_pool", fresh)
    yield fresh
    fresh.close()


@pytest.fixture
def shared3(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostPool]:
    """Three episodes per host."""
    yield from _pool(monkeypatch, 3)


@pytest.fixture
def shared2(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostPool]:
    """Two episodes per host."""
    yield from _pool(monkeypatch, 2)


async def _run(raw: dict, pool: HostPool) -> list:
    runtimes = await start_runtimes(raw, list(range(len(raw["tasks"]))), pool)
    try:
        episodes = [Episode(rt, raw["tasks"][i]["instruction"]) for i, rt in enumerate(runtimes)]
        return await run_episodes(episodes, ScriptedBackend(PLAN))
    finally:
        for rt in runtimes:
            await rt.close()


async def test_a_batch_shares_hosts_and_each_episode_keeps_its_own_env(shared3: HostPool) -> None:
    hosts: set[int] = set()
    raw = spec(modes=("ok",) * 6)
    runtimes = await start_runtimes(raw, list(range(6)), shared3)
    try:
        hosts = {id(rt._host) for rt in runtimes}
        episodes = [Episode(rt, "go") for rt in runtimes]
        done = await run_episodes(episodes, ScriptedBackend(PLAN))
        shared = {rt._host for rt in runtimes}
    finally:
        for rt in runtimes:
            await rt.close()
    assert len(hosts) == 2  # 6 episodes, 3 per host
    for t in done:
        assert t.error is None
        assert [c.result for c in t.tool_calls] == [
            {"version": "v1", "calls": 1},
            {"version": "v1", "calls": 2},
        ]
        assert t.final_state == {"calls": 2, "mode": "ok"}
    # Each turn's three steps on a host went as one message, not three.
    assert all(h is not None and h.batches >= 2 for h in shared)
    assert shared3.leased == 0
    # Given back warm: the next batch reuses them and its envs are fresh.
    again = await _run(raw, shared3)
    assert [c.result["calls"] for t in again for c in t.tool_calls] == [1, 2] * 6


async def test_a_crash_or_hang_on_a_shared_host_is_only_its_own_episodes_tool_error(
    shared2: HostPool,
) -> None:
    # Hosts: (ok, exit2) (hang, ok) (ok, ok). exit2 kills its host on its second step: its
    # partner is replayed on a host of its own and goes on; so does exit2, its step having
    # failed again there (its own tool error). hang's steps are stopped in the host.
    raw = spec(modes=("ok", "exit2", "hang", "ok", "ok", "ok"))
    partner1, crashed, hung, partner2, fine1, fine2 = await _run(raw, shared2)
    assert crashed.error is None and crashed.finish_reason == "stop"
    assert [c.result for c in crashed.tool_calls] == [{"version": "v1", "calls": 1}, None]
    assert crashed.tool_calls[1].error == (
        "go failed: crashed the tool's process; the call had no effect"
    )
    assert crashed.final_state == {"calls": 1, "mode": "exit2"}
    assert hung.error is None and hung.finish_reason == "stop"
    assert all("StepTimeout: did not finish within" in (c.error or "") for c in hung.tool_calls)
    for t in (partner1, partner2, fine1, fine2):
        assert t.error is None and t.finish_reason == "stop"
        assert [c.result for c in t.tool_calls] == [
            {"version": "v1", "calls": 1},
            {"version": "v1", "calls": 2},
        ]
        assert t.final_state == {"calls": 2, "mode": "ok"}
    assert shared2.leased == 0


async def test_a_partner_that_replays_differently_ends_with_the_reason(shared2: HostPool) -> None:
    rand, crashed = await _run(spec(modes=("rand", "exit2")), shared2)
    assert crashed.error is None and "crashed the tool" in (crashed.tool_calls[1].error or "")
    assert rand.finish_reason == "error"
    assert "gave a different result at step 1, so it cannot go on" in rand.error
    assert "shared by 2 episodes" in rand.error
    assert shared2.leased == 0


async def test_a_raising_step_on_a_shared_host_is_only_that_episodes_tool_error(
    shared3: HostPool,
) -> None:
    ok1, raised, ok2 = await _run(spec(modes=("ok", "raise", "ok")), shared3)
    assert [c.error for c in raised.tool_calls] == ["go failed: KeyError: 'no such thing'"] * 2
    for t in (ok1, ok2):
        assert t.error is None and [c.result["calls"] for c in t.tool_calls] == [1, 2]


async def test_a_blocking_call_during_a_shared_hosts_batch_loses_no_reply(
    shared2: HostPool,
) -> None:
    napper, other = await start_runtimes(spec(modes=("nap", "ok")), [0, 1], shared2)
    try:
        assert napper._host is other._host
        step = asyncio.create_task(napper.call_tool("go", {}))
        host = napper._host
        assert host is not None
        for _ in range(10_000):  # until the step is on the wire and awaited (a few loop turns)
            if host._waiter is not None:
                break
            await asyncio.sleep(0)
        assert host._waiter is not None
        # final_state blocks and reads the napping step's reply before its own: it keeps it.
        assert other.final_state() == {"calls": 0, "mode": "ok"}
        out = await step
        assert out.error is None and out.output == {"version": "v1", "calls": 1}
    finally:
        for rt in (napper, other):
            await rt.close()
    assert shared2.leased == 0


async def test_a_finished_partner_still_gets_its_final_state_after_the_crash(
    shared2: HostPool,
) -> None:
    done, crasher = await start_runtimes(spec(modes=("ok", "exit")), [0, 1], shared2)
    try:
        assert (await done.call_tool("go", {})).output == {"version": "v1", "calls": 1}
        crashed = await crasher.call_tool("go", {})
        assert crashed.error is not None and "crashed the tool" in crashed.error
        # Its host died after its last step: the state comes from a replay on a host of its own.
        assert done.final_state() == {"calls": 1, "mode": "ok"}
    finally:
        for rt in (done, crasher):
            await rt.close()
    assert shared2.leased == 0


async def test_a_batch_that_is_only_slow_is_replayed_not_lost(shared2: HostPool) -> None:
    # Each step fits the 2 s step timeout, the turn's two together do not.
    raw = spec(modes=("nap", "nap"))
    for task in raw["tasks"]:
        task["input"]["nap"] = STEP_TIMEOUT_S * 0.6
    runtimes = await start_runtimes(raw, [0, 1], shared2)
    try:
        outs = await asyncio.gather(*(rt.call_tool("go", {}) for rt in runtimes))
    finally:
        for rt in runtimes:
            await rt.close()
    assert [o.output for o in outs] == [{"version": "v1", "calls": 1}] * 2
    assert shared2.leased == 0


async def test_a_state_one_episodes_steps_make_kill_a_shared_host_fails_only_that_one(
    shared3: HostPool,
) -> None:
    # The middle episode's steps make state() kill the host the three share: it is scored with
    # a _stateError (not errored), and its partners' states are taken on replayed hosts.
    done = await _run(spec(modes=("ok", "poison", "ok")), shared3)
    assert all(t.error is None for t in done), [t.error for t in done]
    assert done[0].final_state == done[2].final_state == {"calls": 2, "mode": "ok"}
    assert "took the plugin's host down" in done[1].final_state["_stateError"]
    assert shared3.leased == 0
