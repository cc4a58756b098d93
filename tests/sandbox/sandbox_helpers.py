"""Shared helpers for the sandbox tests: scripts in a work dir and process lookups by token."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from waiting import wait_until

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


async def wait_no_pids(token: str, deadline_s: float = 10.0) -> list[int]:
    """Wait until no host process carries token; return the stragglers at the deadline."""
    try:
        await wait_until(
            lambda: not pids_with_token(token), "no process with the token", deadline_s
        )
    except AssertionError:
        return pids_with_token(token)
    return []


def host_path_exists(path: str | Path) -> bool:
    """Whether path exists on the host (outside any sandbox)."""
    return os.path.lexists(path)
