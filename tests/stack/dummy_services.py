"""Tiny services for the stack tests, registered through ROLLOUT_EXTRA_SERVICES."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from rollout.shared.settings import Settings


async def idle(settings: Settings) -> None:
    """Run until cancelled, touching nothing."""
    await asyncio.Event().wait()


async def crash_once(settings: Settings) -> None:
    """Crash on the first start (recorded in the home), then run normally."""
    marker = Path(settings.home) / "crashed-once"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        raise RuntimeError("deliberate first-start crash")
    await asyncio.Event().wait()


async def always_crash(settings: Settings) -> None:
    """Never comes up."""
    raise RuntimeError("deliberate crash on every start")
