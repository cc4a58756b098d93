"""Sandbox limits: processes, memory, CPU time, wall clock and output size."""

from __future__ import annotations

import asyncio
import os
import secrets
import uuid
from pathlib import Path

import pytest
from sandbox_helpers import pids_with_token, run_python, wait_no_pids
from waiting import wait_until

from rollout.shared.envs.sandbox import SandboxLimits, run_sandboxed


async def test_process_limit_caps_forks(tmp_path: Path) -> None:
    limits = SandboxLimits(max_processes=16, wall_seconds=30)
    result = await run_python(
        tmp_path,
        """
        import os, time
        children = 0
        try:
            while children < 1000:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                children += 1
        except OSError as exc:
            print("refused", children, exc.errno)
        """,
        limits,
    )
    assert result.exit_code == 0, result.stderr
    word, children, errno = result.stdout.split()
    assert word == "refused" and errno == "11"  # EAGAIN
    assert 0 < int(children) < 16


async def test_fork_bomb_is_contained_and_leaves_nothing_behind(tmp_path: Path) -> None:
    token = f"forkbomb-{uuid.uuid4().hex}"
    limits = SandboxLimits(max_processes=32, wall_seconds=3)
    peak = 0
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(await asyncio.to_thread(pids_with_token, token)))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        result = await run_sandboxed(
            ["sh", "-c", "b() { b | b & }; b; sleep 60", token], tmp_path, limits
        )
    finally:
        stop.set()
        await sampler
    assert result.timed_out and result.killed_reason == "wall_timeout"
    assert result.exit_code is None
    assert result.duration_s < 3 + 5
    assert 0 < peak <= limits.max_processes
    assert await wait_no_pids(token) == []
    # The host still forks, and the next sandbox works.
    host_child = await asyncio.create_subprocess_exec("true")
    assert await host_child.wait() == 0
    after = await run_sandboxed(["sh", "-c", "echo alive"], tmp_path)
    assert after.stdout == "alive\n"


async def test_memory_hog_is_stopped(tmp_path: Path) -> None:
    limits = SandboxLimits(memory_mb=256, wall_seconds=30)
    result = await run_python(
        tmp_path, "hog = bytearray(2 * 1024 ** 3)\nprint('allocated', len(hog))\n", limits
    )
    assert result.exit_code not in (0, None)
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


async def test_memory_hog_in_tmpfs_is_stopped(tmp_path: Path) -> None:
    # /tmp is RAM-backed; its size is bounded by the memory limit too.
    limits = SandboxLimits(memory_mb=64, wall_seconds=30)
    result = await run_sandboxed(
        ["sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; echo rc=$?"],
        tmp_path,
        limits,
    )
    assert "No space left on device" in result.stdout
    assert "rc=1" in result.stdout


async def test_cpu_spin_is_stopped_by_the_cpu_limit(tmp_path: Path) -> None:
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=60)
    result = await run_python(tmp_path, "while True:\n    pass\n", limits)
    assert result.killed_reason == "cpu_limit"
    assert result.exit_code == 128 + 24  # SIGXCPU as the shell reports it
    assert not result.timed_out
    assert result.duration_s < 30


async def test_wall_timeout_kills_the_whole_sandbox(tmp_path: Path) -> None:
    # A unique sleep length marks every sleeper, so leftovers can be found on the host.
    # Unique per run even when a plugin seeds `random`: the token finds this run's processes.
    seconds = f"{1000 + secrets.randbelow(9000)}.{100000 + secrets.randbelow(900000)}"
    limits = SandboxLimits(wall_seconds=1)
    # A background child and a detached grandchild in its own session: all must die.
    script = f"sleep {seconds} & (setsid sleep {seconds} &); sleep {seconds}"
    result = await run_sandboxed(["sh", "-c", script], tmp_path, limits)
    assert result.timed_out
    assert result.killed_reason == "wall_timeout"
    assert result.exit_code is None
    assert result.duration_s < 1 + 5
    assert await wait_no_pids(seconds) == []


async def test_output_over_the_cap_is_truncated(tmp_path: Path) -> None:
    limits = SandboxLimits(max_output_bytes=1000)
    result = await run_python(
        tmp_path, "import sys\nsys.stdout.write('a' * 1500)\nsys.stderr.write('e' * 10)\n", limits
    )
    assert result.exit_code == 0
    assert result.stdout == "a" * 1000
    assert result.stderr == "e" * 10
    assert result.output_truncated
    assert result.killed_reason is None


async def test_endless_output_is_killed(tmp_path: Path) -> None:
    limits = SandboxLimits(max_output_bytes=10_000, wall_seconds=60)
    result = await run_sandboxed(["yes"], tmp_path, limits)
    assert result.killed_reason == "output_limit"
    assert result.exit_code is None
    assert not result.timed_out
    assert result.output_truncated
    assert len(result.stdout) == 10_000
    assert result.duration_s < 30


async def test_large_files_are_refused(tmp_path: Path) -> None:
    limits = SandboxLimits(max_file_bytes=1_000_000)
    result = await run_sandboxed(
        ["sh", "-c", "head -c 5000000 /dev/zero > big.bin"], tmp_path, limits
    )
    assert result.exit_code != 0
    assert (tmp_path / "big.bin").stat().st_size <= 1_000_000


async def test_cancelling_the_caller_kills_the_sandbox(tmp_path: Path) -> None:
    # Unique per run even when a plugin seeds `random`: the token finds this run's processes.
    seconds = f"{1000 + secrets.randbelow(9000)}.{100000 + secrets.randbelow(900000)}"
    task = asyncio.create_task(run_sandboxed(["sleep", seconds], tmp_path))
    await wait_until(lambda: pids_with_token(seconds), "the sandbox to start", 10, interval_s=0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_no_pids(seconds) == []
    assert os.stat(tmp_path).st_uid == os.geteuid()
