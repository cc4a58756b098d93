"""A crashing or hanging plugin ends only its own episode; a raising step is a tool error."""

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
from rollout.shared.learning.scripted import ScriptedBackend

PLAN = [("go", {}), ("go", {})]


async def _batch(raw: dict, n: int) -> list:
    runtimes = [build_runtime(raw, i) for i in range(n)]
    try:
        episodes = [Episode(rt, raw["tasks"][i]["instruction"]) for i, rt in enumerate(runtimes)]
        return await run_episodes(episodes, ScriptedBackend(PLAN))
    finally:
        for rt in runtimes:
            await rt.close()


async def test_hanging_step_times_out_and_ends_only_its_episode(pool: HostPool) -> None:
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
    assert hung.finish_reason == "error"
    assert f"did not finish step within {STEP_TIMEOUT_S:g}s" in hung.error
    assert len(hung.tool_calls) == 1 and hung.tool_calls[0].error == hung.error
    assert elapsed < STEP_TIMEOUT_S + 10  # one deadline, not one per episode or per retry


@pytest.mark.parametrize(
    ("mode", "reason"), [("exit", "exit code 3"), ("segv", "killed by SIGSEGV")]
)
async def test_crash_in_step_ends_only_that_episode_with_the_reason(
    pool: HostPool, mode: str, reason: str
) -> None:
    ok, crashed = await _batch(spec(modes=("ok", mode)), 2)
    assert ok.error is None and len(ok.tool_calls) == 2
    assert crashed.finish_reason == "error"
    assert "died during step" in crashed.error and reason in crashed.error, crashed.error
    # The dead host is not given to the next episode: a new one serves it.
    [again] = await _batch(spec(modes=("ok",)), 1)
    assert again.error is None and again.tool_calls[0].result == {"version": "v1", "calls": 1}


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


async def test_actor_batch_records_the_crash_reason_on_that_rollout_only(pool: HostPool) -> None:
    from rollout.services.actor.generate import generate_batch
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
    ok, crashed, hung = await generate_batch(work, spec_, ScriptedBackend(PLAN), actor_id="a1")
    assert ok.error is None and ok.trajectory["final_state"] == {"calls": 2, "mode": "ok"}
    assert "died during step (exit code 3)" in crashed.error
    assert "did not finish step within" in hung.error
    assert crashed.trajectory["finish_reason"] == hung.trajectory["finish_reason"] == "error"


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
