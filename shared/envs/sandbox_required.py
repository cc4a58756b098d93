"""Refusing, in one line with the fix, work whose templates need a sandbox that cannot run here.

Apart from sandbox_check.py (the probe alone, for `rollout status`): knowing which templates run
in the sandbox takes the template registry.
"""

from __future__ import annotations

from rollout.shared.envs.sandbox_check import check_sandbox
from rollout.shared.envs.templates import get_template
from rollout.shared.errors import RolloutError


async def require_sandbox(templates: set[str]) -> None:
    """RolloutError with the one-line problem when any of `templates` needs a missing sandbox."""
    if not any((t := get_template(name)) is not None and t.sandboxed for name in templates):
        return
    check = await check_sandbox()
    if not check.ok:
        raise RolloutError(check.line())
