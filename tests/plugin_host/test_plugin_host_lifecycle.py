"""Hosts never hold up the event loop, and every host ends: closed, abandoned or left by a
killed process."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from host_plugins import COUNTER, IMPORT_S, SLOW_IMPORT, spec

from rollout.cli import main as cli_main
from rollout.errors import RolloutError
from rollout.shared.envs import build_runtime
from rollout.shared.envs.engine import start_runtime, start_runtimes
from rollout.shared.envs.plugin_host import client
from rollout.shared.envs.plugin_host.client import HostPool, HostSettings

T = TypeVar("T")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def _longest_stall(work: Awaitable[T]) -> tuple[T, float]:
    """Run work while a ticker measures the longest time the event loop did not get to it."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.005)  # the ticker's cadence, not a wait for anything
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        result = await work
    finally:
        done.set()
        await ticker
    return result, max(gaps, default=0.0)


async def test_a_cold_host_starts_without_blocking_the_event_loop(pool: HostPool) -> None:
    raw = spec(SLOW_IMPORT, module="slowimport")
    started = time.monotonic()
    rt, stall = await _longest_stall(start_runtime(raw, 0))
    took = time.monotonic() - started
    try:
        assert took >= IMPORT_S  # it really was a cold start
        assert stall < IMPORT_S / 2, f"the loop stalled {stall:.2f}s during a {took:.2f}s start"
        assert (await rt.call_tool("go", {})).output == {"version": "v1", "calls": 1}
    finally:
        await rt.close()


THIRD_ENV_REFUSED = COUNTER.replace(
    "def make_env(options):\n    return Env(options)",
    "CALLS = [0]\n\n\ndef make_env(options):\n    CALLS[0] += 1\n"
    "    if CALLS[0] == 3:\n        raise RuntimeError('third env refused')\n"
    "    return Env(options)",
)


async def test_start_runtimes_gives_back_what_it_started_when_one_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert THIRD_ENV_REFUSED != COUNTER
    shared = HostPool(HostSettings(step_timeout_s=2.0, start_timeout_s=5.0, episodes_per_host=3))
    monkeypatch.setattr(client, "_pool", shared)
    try:
        raw = spec(THIRD_ENV_REFUSED, modes=("ok", "ok", "ok"))
        with pytest.raises(RolloutError, match="third env refused"):
            await start_runtimes(raw, [0, 1, 2], shared)
        assert shared.leased == 0
        # The two envs made before the failure were given back with their host, warm.
        assert shared.idle_count("hostplug:make_env", raw["config"]["sources"]) >= 1
        runtimes = await start_runtimes(spec(modes=("ok", "ok")), [0, 1], shared)
        assert shared.leased == 1  # one host shared by both
        for rt in runtimes:
            await rt.close()
        assert shared.leased == 0
    finally:
        shared.close()


async def test_waiting_for_a_slow_step_never_holds_the_loop(pool: HostPool) -> None:
    rt = build_runtime(spec(modes=("nap",)), 0)
    try:
        started = time.monotonic()
        out, stall = await _longest_stall(rt.call_tool("go", {}))
        took = time.monotonic() - started
        assert out.output == {"version": "v1", "calls": 1}
        assert took >= 0.5
        # The quick wait outside the loop is bounded (2 ms); the rest goes through the loop.
        assert stall < 0.25, f"the loop stalled {stall:.2f}s during a {took:.2f}s step"
    finally:
        await rt.close()


async def test_fast_steps_answer_the_same_with_or_without_the_quick_wait(
    pool: HostPool,
) -> None:
    raw = spec(modes=("ok",))
    outputs = []
    for quick in (0.0, 0.002):
        pool.settings.quick_wait_s = quick
        rt = build_runtime(raw, 0)
        try:
            outputs.append([(await rt.call_tool("go", {})).output for _ in range(20)])
            # Concurrent calls of two episodes (the loop has ready work: no quick wait).
            other = build_runtime(raw, 0)
            try:
                pair = await asyncio.gather(rt.call_tool("go", {}), other.call_tool("go", {}))
                assert [r.output["calls"] for r in pair] == [21, 1]
            finally:
                await other.close()
        finally:
            await rt.close()
    assert outputs[0] == outputs[1] == [{"version": "v1", "calls": i} for i in range(1, 21)]


async def test_a_runtime_dropped_without_close_gives_its_host_up(pool: HostPool) -> None:
    raw = spec()
    rt = build_runtime(raw, 0)
    host = rt._host
    assert host is not None and pool.leased == 1
    del rt
    gc.collect()
    # The host is killed at the pool's next use (never from inside the garbage collector).
    rt = build_runtime(raw, 0)
    try:
        assert host.dead is not None
        assert host.process.proc.poll() is not None
        assert pool.leased == 1
    finally:
        await rt.close()
    assert pool.leased == 0


async def test_a_failed_host_is_given_back_and_closed(pool: HostPool) -> None:
    rt = build_runtime(spec(modes=("exit",)), 0)
    host = rt._host
    out = await rt.call_tool("go", {})
    assert out.error == "go failed: crashed the tool's process; the call had no effect"
    # The dead host is closed; the episode goes on on a fresh one, which close gives back.
    assert host is not None and host.dead is not None and host.process.proc.poll() is not None
    assert rt._host is not None and rt._host is not host and rt._host.alive
    assert pool.leased == 1
    await rt.close()
    assert pool.leased == 0


def test_plan_closes_the_plugin_runtime_it_lists_tools_from(
    pool: HostPool, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["plan", str(EXAMPLES / "plugin_counter.py")]) == 0
    assert "tools: increment, read" in capsys.readouterr().out
    assert pool.leased == 0


def _plugin_whose_reset_fails(folder: Path) -> Path:
    """The counter example's env file, its plugin's reset() raising RuntimeError('no db')."""
    counter = (EXAMPLES / "example_plugins" / "counter.py").read_text()
    broken = counter.replace(
        "    def reset(self, task: dict[str, Any]) -> None:\n",
        "    def reset(self, task: dict[str, Any]) -> None:\n        raise RuntimeError('no db')\n",
    )
    assert broken != counter
    (folder / "broken_plugins").mkdir()
    (folder / "broken_plugins" / "counter.py").write_text(broken)
    env_file = folder / "broken.py"
    env_file.write_text(
        (EXAMPLES / "plugin_counter.py")
        .read_text()
        .replace("example_plugins.counter", "broken_plugins.counter")
    )
    return env_file


def test_plan_names_a_plugin_whose_reset_fails(
    pool: HostPool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every rollout of such an env errors: plan must not call it OK (it listed "tools: none").
    env_file = _plugin_whose_reset_fails(tmp_path)
    assert cli_main(["plan", str(env_file)]) == 1
    out = capsys.readouterr().out
    assert "✗ counter-plugin: 1 problem(s)" in out
    assert (
        "tasks[0]: the environment cannot start: plugin reset() raised RuntimeError: no db" in out
    )
    assert pool.leased == 0


def test_push_refuses_a_plugin_that_cannot_start(
    pool: HostPool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # plan refused it, push registered it (no stack is needed: it is refused before sending).
    env_file = _plugin_whose_reset_fails(tmp_path)
    assert cli_main(["push", str(env_file)]) == 1
    err = capsys.readouterr().err
    assert f"{env_file}: not pushed, fix these first" in err
    assert (
        "counter-plugin: tasks[0]: the environment cannot start: plugin reset() raised "
        "RuntimeError: no db" in err
    )
    assert "Traceback" not in err and pool.leased == 0


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(proc.stdout)


def test_stale_host_folders_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / f"rollout-plugin-hosts-{_dead_pid()}-abc"
    (dead / "host-x").mkdir(parents=True)
    (dead / "host-x" / "f").write_text("x")
    live_proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                 stdin=subprocess.PIPE)  # fmt: skip
    try:
        live = tmp_path / f"rollout-plugin-hosts-{live_proc.pid}-def"
        live.mkdir()
        # A symlink named like a dead process's folder is never followed nor removed.
        target = tmp_path / "precious"
        target.mkdir()
        (target / "keep").write_text("x")
        planted = tmp_path / f"rollout-plugin-hosts-{_dead_pid()}-lnk"
        planted.symlink_to(target)
        other = tmp_path / "something-else-1"
        other.mkdir()

        removed = client.remove_stale_roots(str(tmp_path))

        assert removed == [dead]
        assert not dead.exists()
        assert live.is_dir() and other.is_dir() and planted.is_symlink()
        assert (target / "keep").read_text() == "x"
    finally:
        live_proc.kill()
        live_proc.wait()


def test_a_sigkilled_process_leaves_no_host_folder_behind(tmp_path: Path) -> None:
    # A process that made its host folder and was SIGKILLed (no atexit ran)...
    env: dict[str, Any] = {**os.environ, "TMPDIR": str(tmp_path)}
    code = (
        "import os, signal\n"
        "from rollout.shared.envs.plugin_host import client\n"
        "print(client._private_root(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL
    left = Path(proc.stdout.strip())
    assert left.is_dir() and left.parent == tmp_path
    # ...is cleaned up by the next process that makes its own.
    proc = subprocess.run(
        [sys.executable, "-c", code.replace("os.kill(os.getpid(), signal.SIGKILL)\n", "")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    mine = Path(proc.stdout.strip())
    assert not left.exists()
    assert not mine.exists()  # and its own went at its exit


def test_hosts_started_off_the_loop_outlive_that_loop(pool: HostPool) -> None:
    raw = spec()

    async def episode(start: bool) -> Any:
        rt = await start_runtime(raw, 0) if start else build_runtime(raw, 0)
        try:
            return (await rt.call_tool("go", {})).output
        finally:
            await rt.close()

    # Started in a thread while that loop ran; the loop (and its default executor) then ends.
    assert asyncio.run(episode(start=True)) == {"version": "v1", "calls": 1}
    started = pool.started
    idle = pool.idle_count("hostplug:make_env", raw["config"]["sources"])
    assert idle >= 1
    # The warm hosts are still alive for the next loop: nothing new is started.
    for _ in range(idle):
        assert asyncio.run(episode(start=False)) == {"version": "v1", "calls": 1}
    assert pool.started == started


def test_plan_and_push_name_each_task_a_plugin_cannot_start(
    pool: HostPool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The counter's reset() reads int(task["input"]["target"]): a task whose target is no
    # number fails every one of its rollouts, yet plan and push started tasks[0] only.
    shutil.copytree(EXAMPLES / "example_plugins", tmp_path / "example_plugins")
    env_file = tmp_path / "counter.py"
    env_file.write_text(
        (EXAMPLES / "plugin_counter.py").read_text()
        + "\nenv.tasks[3] = env.tasks[3].model_copy(update={'input': {'target': 'x'}})\n"
    )
    problem = (
        "tasks[3]: the environment cannot start: plugin reset() raised ValueError: invalid "
        "literal for int() with base 10: 'x'"
    )
    assert cli_main(["plan", str(env_file)]) == 1
    out = capsys.readouterr().out
    assert "✗ counter-plugin: 1 problem(s)" in out and f"    - {problem}\n" in out
    assert cli_main(["push", str(env_file)]) == 1
    assert f"counter-plugin: {problem}\n" in capsys.readouterr().err
    assert pool.leased == 0
