"""A step that raises, hangs or kills its host is a tool error the model sees and the episode
goes on; what the model's arguments cannot cause (no host, a replay that differs) errors only
its own episode."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from host_plugins import COUNTER, STEP_TIMEOUT_S, spec

from rollout.errors import RolloutError
from rollout.shared.agent.loop import Episode, run_episodes
from rollout.shared.envs import build_runtime, validate_environment
from rollout.shared.envs.plugin_host.client import HostPool
from rollout.shared.envs.runtime import EnvironmentFailed
from rollout.shared.learning.scripted import ScriptedBackend

PLAN = [("go", {}), ("go", {})]
# The worker's own deadline for a step (the host's, STEP_TIMEOUT_S, is a little later).
SOFT_S = STEP_TIMEOUT_S - min(1.0, STEP_TIMEOUT_S / 5)
CRASHED = "go failed: crashed the tool's process; the call had no effect"


async def _batch(raw: dict, n: int) -> list:
    runtimes = [build_runtime(raw, i) for i in range(n)]
    try:
        episodes = [Episode(rt, raw["tasks"][i]["instruction"]) for i, rt in enumerate(runtimes)]
        return await run_episodes(episodes, ScriptedBackend(PLAN))
    finally:
        for rt in runtimes:
            await rt.close()


async def test_a_hanging_step_is_stopped_as_its_tool_error_and_the_env_lives_on(
    pool: HostPool,
) -> None:
    raw = spec(modes=("ok", "hang", "ok"))
    started = time.monotonic()
    ok1, hung, ok2 = await _batch(raw, 3)
    elapsed = time.monotonic() - started
    for done in (ok1, ok2):
        assert done.error is None and done.finish_reason == "stop"
        assert [c.result for c in done.tool_calls] == [
            {"version": "v1", "calls": 1},
            {"version": "v1", "calls": 2},
        ]
        assert done.final_state == {"calls": 2, "mode": "ok"}
    # The model's call hung: it is told so, and the episode goes on to be scored (an errored
    # episode would be left out of the pass rate: hanging the tool would dodge the verdict).
    assert hung.error is None and hung.finish_reason == "stop"
    stopped = f"go failed: StepTimeout: did not finish within {SOFT_S:g}s (stopped)"
    assert [c.error for c in hung.tool_calls] == [stopped] * 2
    # Stopped inside its host, before the host's deadline: the env kept both calls.
    assert hung.final_state == {"calls": 2, "mode": "hang"}
    assert elapsed < 2 * STEP_TIMEOUT_S + 10  # one deadline per call, not more


@pytest.mark.parametrize(("mode", "signal_name"), [("exit", "exit code 3"), ("segv", "SIGSEGV")])
async def test_a_step_that_kills_its_host_is_its_tool_error_and_the_episode_goes_on(
    pool: HostPool, mode: str, signal_name: str
) -> None:
    ok, crashed = await _batch(spec(modes=("ok", mode)), 2)
    assert ok.error is None and len(ok.tool_calls) == 2
    assert crashed.error is None and crashed.finish_reason == "stop"
    assert [c.error for c in crashed.tool_calls] == [CRASHED] * 2
    # Each call had no effect: the episode was replayed on a fresh host (reset, no step).
    assert crashed.final_state == {"calls": 0, "mode": mode}
    # The host's own reason (its stderr: the plugin's prints) goes to the log, not the model.
    assert not any(signal_name in m["content"] for m in crashed.messages if m["role"] == "tool")
    # The dead host is not given to the next episode: a new one serves it.
    [again] = await _batch(spec(modes=("ok",)), 1)
    assert again.error is None and again.tool_calls[0].result == {"version": "v1", "calls": 1}
    assert pool.leased == 0


@pytest.mark.parametrize(
    ("how", "error", "calls_after"),
    [
        # The host died: the episode is replayed without the call (no effect).
        ("exit", CRASHED, 2),
        # Code that keeps the worker's alarm out is killed at the host's deadline: the same.
        ("stubborn_hang", f"go failed: did not finish within {STEP_TIMEOUT_S:g}s (stopped); "
                          "the call had no effect", 2),
        # sys.exit() is an exception in the step like any other: the env lives on.
        ("sys_exit", "go failed: SystemExit: bye", 3),
    ],
)  # fmt: skip
async def test_arguments_that_break_the_plugin_are_that_calls_error_and_the_next_call_works(
    pool: HostPool, how: str, error: str, calls_after: int
) -> None:
    plan = [("go", {}), ("go", {"how": how}), ("go", {})]
    raw = spec()
    rt = build_runtime(raw, 0)
    try:
        [t] = await run_episodes([Episode(rt, "go")], ScriptedBackend(plan))
    finally:
        await rt.close()
    assert t.error is None and t.finish_reason == "stop"
    assert [c.error for c in t.tool_calls] == [None, error, None]
    assert t.tool_calls[2].result == {"version": "v1", "calls": calls_after}
    assert t.final_state == {"calls": calls_after, "mode": "ok"}
    assert pool.leased == 0


async def test_a_hanging_async_step_is_stopped_and_the_plugins_loop_still_serves(
    pool: HostPool,
) -> None:
    rt = build_runtime(spec(), 0)
    try:
        hung = await rt.call_tool("slow", {"how": "hang"})
        assert (
            hung.error == f"slow failed: StepTimeout: did not finish within {SOFT_S:g}s (stopped)"
        )
        # The stopped coroutine was cancelled, not left in the loop: the next steps run alone.
        assert (await rt.call_tool("slow", {})).output == {"async": True, "calls": 2}
        assert (await rt.call_tool("go", {})).output == {"version": "v1", "calls": 3}
    finally:
        await rt.close()


async def test_a_crash_in_a_plugin_that_replays_differently_errors_the_episode(
    pool: HostPool,
) -> None:
    # Its episode cannot be rebuilt faithfully (each call draws a random number): the env's
    # fault, not a verdict on the model.
    plan = [("go", {}), ("go", {"how": "exit"})]
    rt = build_runtime(spec(modes=("rand",)), 0)
    try:
        [t] = await run_episodes([Episode(rt, "go")], ScriptedBackend(plan))
    finally:
        await rt.close()
    assert t.finish_reason == "error" and "died during step (exit code 3)" in t.error
    assert "gave a different result at step 1, so it cannot go on" in t.error
    assert pool.leased == 0


@pytest.mark.parametrize("how", ["poison_exit", "poison_hang"])
async def test_a_state_the_models_steps_make_kill_its_host_is_scored_not_errored(
    pool: HostPool, how: str
) -> None:
    # The step left what state() cannot cope with (it exits, or hangs past the deadline):
    # the episode was errored, left out of pass rates and GRPO's groups, so a model escaped a
    # failing verdict by sending it. On a fresh host right after reset state() answers: the
    # steps did it, and the final state says so.
    rt = build_runtime(spec(), 0)
    try:
        [t] = await run_episodes([Episode(rt, "go")], ScriptedBackend([("go", {"how": how})]))
    finally:
        await rt.close()
    assert t.error is None and t.finish_reason == "stop"
    assert (
        "state() took the plugin's host down after this episode's steps"
        in (t.final_state["_stateError"])
    )
    assert pool.leased == 0


async def test_a_state_that_kills_its_host_whatever_the_steps_errors_the_episode(
    pool: HostPool,
) -> None:
    # No step of the model's made it: the env's fault, no verdict.
    rt = build_runtime(spec(modes=("state_exit",)), 0)
    try:
        [t] = await run_episodes([Episode(rt, "go")], ScriptedBackend([("go", {})]))
    finally:
        await rt.close()
    assert t.finish_reason == "stop" and "died during state" in t.error
    assert pool.leased == 0


async def test_no_host_to_go_on_with_after_a_crash_errors_the_episode(
    pool: HostPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = build_runtime(spec(), 0)

    def unavailable(*args: object, **kwargs: object) -> None:
        raise RolloutError("the sandbox is unavailable: bwrap cannot start")

    try:
        monkeypatch.setattr(pool, "lease", unavailable)  # the platform, from here on
        with pytest.raises(EnvironmentFailed, match="no host to replay this episode on: the sa"):
            await rt.call_tool("go", {"how": "exit"})
    finally:
        await rt.close()
    assert pool.leased == 0


async def test_a_raising_step_is_a_tool_error_the_model_sees(pool: HostPool) -> None:
    [t] = await _batch(spec(modes=("raise",)), 1)
    assert t.error is None and t.finish_reason == "stop"
    assert [c.error for c in t.tool_calls] == ["go failed: KeyError: 'no such thing'"] * 2
    assert '"go failed: KeyError' in t.messages[3]["content"]


async def test_hanging_reset_ends_only_its_episode(pool: HostPool) -> None:
    ok, hung = await _batch(spec(modes=("ok", "hang_reset")), 2)
    assert ok.error is None and len(ok.tool_calls) == 2
    assert hung.finish_reason == "error" and hung.tool_calls == []
    assert f"did not finish reset within {STEP_TIMEOUT_S:g}s" in hung.error


async def test_hanging_import_errors_each_episode_once(pool: HostPool) -> None:
    raw = spec("while True:\n    pass\n", modes=("ok", "ok"))
    started = time.monotonic()
    first, second = await _batch(raw, 2)
    for t in (first, second):
        assert t.finish_reason == "error"
        assert "did not finish importing it within 5s" in t.error
    assert time.monotonic() - started < 5 + 3  # the second episode did not wait again


async def test_large_result_is_capped_with_a_clear_error(pool: HostPool) -> None:
    rt = build_runtime(spec(modes=("huge",)), 0)
    try:
        out = await rt.call_tool("go", {})
        assert out.error is not None and "at most 1000000 are returned" in out.error
        again = await rt.call_tool("slow", {})  # the host is fine afterwards
        assert again.output == {"async": True, "calls": 2}
    finally:
        await rt.close()


async def test_warm_host_serves_sequential_episodes_with_fresh_envs(pool: HostPool) -> None:
    raw = spec(modes=("ok", "ok"))
    for i in range(3):
        rt = build_runtime(raw, i % 2)
        assert (await rt.call_tool("go", {})).output == {"version": "v1", "calls": 1}
        await rt.close()
    # The first lease starts its host and one spare; later episodes reuse them.
    assert pool.started <= 2


async def test_new_version_gets_a_new_host_in_the_same_process(pool: HostPool) -> None:
    v1 = spec()
    v2 = spec(COUNTER.replace('VERSION = "v1"', 'VERSION = "v2"'))
    for raw, want in ((v1, "v1"), (v2, "v2"), (v1, "v1")):
        rt = build_runtime(raw, 0)
        assert (await rt.call_tool("go", {})).output["version"] == want
        await rt.close()
    assert pool.idle_count("hostplug:make_env", v1["config"]["sources"]) >= 1
    assert pool.idle_count("hostplug:make_env", v2["config"]["sources"]) >= 1


@pytest.mark.parametrize("name", ["json", "os", "rollout"])
def test_plugin_named_like_stdlib_or_rollout_is_refused(pool: HostPool, name: str) -> None:
    raw = spec(module=name)
    problems = validate_environment(raw)
    assert any(p.startswith(f"config.sources['{name}.py']") for p in problems), problems
    assert any(p.startswith("config.entrypoint") and "reserved" in p for p in problems), problems
    with pytest.raises(RolloutError, match="config.entrypoint"):
        build_runtime(raw, 0)
    assert pool.started == 0  # refused before any host was started


def test_package_folder_named_like_stdlib_is_refused(pool: HostPool) -> None:
    raw = spec(module="mine")
    raw["config"]["sources"]["email/__init__.py"] = "x = 1\n"
    problems = validate_environment(raw)
    assert any("config.sources['email/__init__.py']" in p and "shadow" in p for p in problems)


async def test_a_rollout_whose_tool_crashed_or_hung_is_scored_not_errored(pool: HostPool) -> None:
    from rollout.services.actor.generate import generate_batch
    from rollout.services.verifier.scoring import score_rollout
    from rollout.shared.contracts.envspec import EnvironmentSpec
    from rollout.shared.contracts.work import RolloutItem, RolloutWork

    spec_ = EnvironmentSpec.model_validate(spec(modes=("ok", "exit", "hang")))
    work = RolloutWork(
        work_item_id="w1",
        run_id="r1",
        env_slug=spec_.slug,
        env_version=1,
        env_hash=spec_.spec_hash(),
        model="scripted",
        items=[
            RolloutItem(rollout_id=f"ro-{i}", task_index=i, sample_index=0, seed=i)
            for i in range(3)
        ],
        trace_id="t",
        correlation_id="c",
        causation_id="c",
    )
    generated = await generate_batch(work, spec_, ScriptedBackend(PLAN), actor_id="a1")
    ok, crashed, hung = generated
    assert ok.trajectory["final_state"] == {"calls": 2, "mode": "ok"}
    for r in (ok, crashed, hung):
        assert r.error is None and r.trajectory["finish_reason"] == "stop"
    assert [c["error"] for c in crashed.trajectory["tool_calls"]] == [CRASHED] * 2
    # The verdicts: the model whose calls all failed fails (no call of `go` succeeded), and
    # counts in the pass rate; errored would have left it out.
    verdicts = [await score_rollout(spec_, r) for r in generated]
    assert [v.outcome for v in verdicts] == ["passed", "failed", "failed"]
    assert all(v.error is None for v in verdicts)


async def test_memory_limit_is_a_tool_error_and_the_host_lives_on(pool: HostPool) -> None:
    rt = build_runtime(spec(modes=("alloc",)), 0)
    try:
        out = await rt.call_tool("go", {})
        assert out.error == "go failed: MemoryError: "
        assert (await rt.call_tool("slow", {})).output == {"async": True, "calls": 2}
    finally:
        await rt.close()


def test_bundled_sources_cannot_shadow_the_stdlib_even_unvalidated(pool: HostPool) -> None:
    # Straight to the pool, past validation: the worker still imports the real json.
    sources = {
        "json.py": "raise SystemExit('the shadow was imported')\n",
        "which_json.py": "import json\n\ndef make_env(options):\n    return json.__file__\n",
    }
    host = pool.lease("which_json:make_env", sources)
    try:
        with pytest.raises(ValueError, match="returned str"):
            host.call("reset", {"options": {}, "probe": True})
    finally:
        pool.release(host)


def test_sources_are_materialised_privately(pool: HostPool) -> None:
    import stat
    import tempfile
    from pathlib import Path

    from rollout.shared.envs.plugin_host import client

    shared = Path(tempfile.gettempdir()) / "rollout-plugins"
    before = set(shared.iterdir()) if shared.exists() else set()
    rt = build_runtime(spec(), 0)
    try:
        root = client._private_root()
        assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.geteuid()
        # Nothing of the plugin's source is written on the host: it lives in the sandbox's /tmp.
        assert not list(root.rglob("hostplug.py"))
    finally:
        asyncio.run(rt.close())
    after = set(shared.iterdir()) if shared.exists() else set()
    assert after == before
