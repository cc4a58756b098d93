"""Shared helpers for the sandbox tests: scripts in a work dir and process lookups by token."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time
from pathlib import Path

from rollout.shared.envs.sandbox import SandboxLimits, SandboxResult, run_sandboxed


async def run_python(
    workdir: Path, source: str, limits: SandboxLimits | None = None, *args: str
) -> SandboxResult:
    """Write source to workdir/script.py and run it with this interpreter in the sandbox."""
    (workdir / "script.py").write_text(textwrap.dedent(source))
    return await run_sandboxed([sys.executable, "script.py", *args], workdir, limits)


def pids_with_token(token: str) -> list[int]:
    """Host pids whose command line contains token (how the tests find sandbox leftovers)."""
    found = []
    needle = token.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _poll_no_pids(token: str, deadline_s: float) -> list[int]:
    end = time.monotonic() + deadline_s
    while (left := pids_with_token(token)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


async def wait_no_pids(token: str, deadline_s: float = 10.0) -> list[int]:
    """Wait until no host process carries token; return the stragglers at the deadline."""
    return await asyncio.to_thread(_poll_no_pids, token, deadline_s)


def host_path_exists(path: str | Path) -> bool:
    """Whether path exists on the host (outside any sandbox)."""
    return os.path.lexists(path)
