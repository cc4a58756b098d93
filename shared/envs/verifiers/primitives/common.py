"""What several primitives share: reading the final state and text, binary outcomes."""

from __future__ import annotations

import json
from typing import Any

from rollout.shared.envs.paths import PathError, resolve_path
from rollout.shared.envs.verifiers.registry import (
    Outcome,
    ScoreContext,
)

MISSING = object()


def binary(ok: bool, reason: str) -> Outcome:
    """Score 1 and passed, or 0 and failed, with the reason."""
    return Outcome(1.0 if ok else 0.0, ok, reason)


def lookup(state: Any, key: str) -> Any:
    """The value at `key` in the state (a literal key or a dot path); MISSING when absent."""
    # A literal top-level key wins (so "orders.O-1" can be a key); otherwise it is a path.
    if isinstance(state, dict) and key in state:
        return state[key]
    try:
        return resolve_path(state, key)
    except PathError:
        return MISSING


def text_of(ctx: ScoreContext, source: str) -> str | None:
    """The text a primitive reads: the final output, the assistant turns, or a state path."""
    if source == "output":
        return ctx.trajectory.final_output or ""
    if source == "messages":
        parts = []
        for m in ctx.trajectory.messages:
            content = m.get("content")
            if m.get("role") == "assistant" and isinstance(content, str):
                parts.append(content)
        return "\n".join(parts)
    value = lookup(ctx.state, source)
    if value is MISSING:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
