"""Can a sandbox run here? One probe, answered as one plain line with the fix.

`rollout up`, `rollout status`, `rollout test` and the scripted demonstrations ask this before
they depend on the sandbox, so a machine without a usable bubblewrap is told so in one line
instead of code-editing tasks failing their verifier one by one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rollout.shared.envs.sandbox import (
    SANDBOX_FIX,
    SandboxLimits,
    SandboxUnavailable,
    find_bwrap,
    run_sandboxed,
)

# The Landlock probe lives with the hidden tests' confinement, a module that never imports
# `rollout` (their bootstrap loads it alone, from its file). Loaded here the same way: importing
# it as a module of the templates package would load every template, which `rollout status`
# (asking only whether a sandbox runs) has no use for.
_CONFINE = Path(__file__).with_name("templates") / "_xproc_confine.py"


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: no Landlock, or disabled)."""
    spec = importlib.util.spec_from_file_location("_rollout_landlock_probe", _CONFINE)
    assert spec is not None and spec.loader is not None, _CONFINE
    confine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(confine)
    return int(confine.landlock_abi())


@dataclass(frozen=True)
class SandboxCheck:
    """The outcome of one probe: which bwrap, and the one-line problem when none can run."""

    bwrap: str | None
    problem: str | None
    landlock: int = 0

    @property
    def ok(self) -> bool:
        """True when a sandboxed command ran."""
        return self.problem is None

    def line(self) -> str:
        """`sandbox: ok (bwrap at ...; Landlock ...)` or the problem with its fix, on one line."""
        if not self.ok:
            return str(self.problem)
        # Processes the hidden tests start are confined by Landlock (`_xproc_confine`); without
        # it they cannot start one, which a code-editing env's CLI tests need to know.
        landlock = (
            f"Landlock ABI {self.landlock}"
            if self.landlock
            else "no Landlock: hidden tests cannot start processes"
        )
        return f"sandbox: ok (bwrap at {self.bwrap}; {landlock})"


def one_line(message: str) -> str:
    """The message on one line, naming the fix (added when the message has none)."""
    text = " ".join(message.split())
    if not text.startswith("no sandbox"):
        text = f"no sandbox: {text}"
    return text if "fix:" in text else f"{text} ({SANDBOX_FIX})"


async def check_sandbox() -> SandboxCheck:
    """Run `true` in the sandbox once; the bwrap used, or why nothing can run."""
    bwrap = None
    try:
        bwrap = find_bwrap()
        with tempfile.TemporaryDirectory(prefix="rollout-sandbox-check-") as tmp:
            result = await run_sandboxed(["true"], Path(tmp), SandboxLimits(wall_seconds=30))
    except SandboxUnavailable as exc:
        return SandboxCheck(bwrap, one_line(exc.message))
    if result.exit_code != 0:
        why = result.killed_reason or result.stderr.strip() or f"exit code {result.exit_code}"
        return SandboxCheck(bwrap, one_line(f"a sandboxed `true` failed ({why})"))
    return SandboxCheck(bwrap, None, landlock_abi())


def check_sandbox_sync() -> SandboxCheck:
    """check_sandbox for code without an event loop."""
    return asyncio.run(check_sandbox())
