"""Whether an env's verdicts measure anything (no NATS, no SDK: the CLI and the viewer use it).

`rollout generate` over a prompts file without answers pushes a tool-less `custom` env whose
only check is `no_tool_errors`, which passes any reply: its runs' 100% measured nothing, so no
pass rate is shown for them and "passed" rollouts of it only ended without a tool error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Why a run of an env that `judges_nothing` has no pass rate (generate, show, runs, compare,
# the viewer).
NOTHING_SCORED = (
    "nothing was scored: no prompt carries an 'answer' (its one check, no_tool_errors in an env "
    "without tools, passes any reply)"
)


def judges_nothing(spec: Mapping[str, Any]) -> bool:
    """An env spec whose verdicts measure nothing: a tool-less `custom` env checked only by
    `no_tool_errors`, which passes any reply (what a prompts file without answers becomes)."""
    verifier = spec.get("verifier")
    primitives = verifier.get("primitives") if isinstance(verifier, Mapping) else verifier
    config = spec.get("config")
    return (
        spec.get("template") == "custom"
        and not (config.get("tools") if isinstance(config, Mapping) else None)
        and isinstance(primitives, list)
        and bool(primitives)
        and all(isinstance(p, Mapping) and p.get("type") == "no_tool_errors" for p in primitives)
    )
