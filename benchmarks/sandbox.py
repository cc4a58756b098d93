"""Benchmark: sandboxed test runs/s against running the same command bare, in one process.

Usage: python benchmarks/sandbox.py [--runs N] [--workload pytest|python|true ...]

Each workload runs in a freshly materialised work dir, first bare (asyncio subprocess, same
environment and cwd) and then through ``run_sandboxed``; both must succeed every time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from rollout.shared.envs.sandbox import SandboxLimits, _sandbox_env, run_sandboxed

WORKLOADS: dict[str, list[str]] = {
    "pytest": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"],
    "python": [sys.executable, "-c", "import calc; assert calc.add(2, 3) == 5"],
    "true": ["true"],
}

FILES = {
    "calc.py": "def add(a, b):\n    return a + b\n",
    "test_calc.py": (
        "from calc import add\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_add_negative():\n    assert add(-2, -3) == -5\n"
    ),
}


def materialise() -> Path:
    """A temp dir holding the small code-editing task the workloads run against."""
    workdir = Path(tempfile.mkdtemp(prefix="rollout-bench-sandbox-"))
    for name, text in FILES.items():
        (workdir / name).write_text(text)
    return workdir


async def run_bare(command: list[str], workdir: Path) -> int:
    """Run command without a sandbox, with the environment the sandbox would give it."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=workdir,
        env=_sandbox_env(workdir, None),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode


async def run_boxed(command: list[str], workdir: Path) -> int:
    """Run command through the bubblewrap sandbox."""
    result = await run_sandboxed(command, workdir, SandboxLimits(wall_seconds=120))
    if result.exit_code != 0:
        raise RuntimeError(f"sandboxed run failed: {result.stderr[-2000:]}")
    return result.exit_code


async def rate(
    runner: Callable[[list[str], Path], Awaitable[int]],
    command: list[str],
    workdir: Path,
    runs: int,
) -> float:
    """Runs per second of runner(command) over `runs` sequential runs after one warm-up."""
    assert await runner(command, workdir) == 0
    started = time.perf_counter()
    for _ in range(runs):
        assert await runner(command, workdir) == 0
    return runs / (time.perf_counter() - started)


async def main(runs: int, workloads: list[str]) -> None:
    """Measure every workload bare and sandboxed and print the rates and their ratio."""
    print(f"{'workload':<8} {'bare runs/s':>12} {'sandboxed runs/s':>17} {'sandboxed/bare':>15}")
    for name in workloads:
        workdir = materialise()
        try:
            bare = await rate(run_bare, WORKLOADS[name], workdir, runs)
            boxed = await rate(run_boxed, WORKLOADS[name], workdir, runs)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"{name:<8} {bare:>12.1f} {boxed:>17.1f} {boxed / bare:>15.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per workload and mode")
    parser.add_argument(
        "--workload", action="append", choices=sorted(WORKLOADS), help="default: all"
    )
    args = parser.parse_args()
    # The sandbox logs every run at debug level; keep the table readable.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    asyncio.run(main(args.runs, args.workload or ["pytest", "python", "true"]))
