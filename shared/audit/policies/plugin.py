"""Plugin policies: whatever the tool schemas allow, pushed to extremes."""

from __future__ import annotations

from rollout.shared.audit.policies.base import CLAIM, Policy, View, calls, properties, say
from rollout.shared.models.base import ChatResponse

PLUGIN = frozenset({"plugin", "custom", "openenv"})
INJECTIONS = ("'; DROP TABLE t; --", "../../../../etc/passwd", "{{7*7}}", "__import__('os')")


def _extreme(schema: dict) -> object:
    kind = schema.get("type")
    if kind == "integer":
        return 10**18
    if kind == "number":
        return -1e308
    if kind == "boolean":
        return True
    if kind == "array":
        return list(range(1000))
    return "A" * 5000


def _each(view: View, args_of) -> ChatResponse:  # noqa: ANN001
    plan = view.tools
    if view.turn < len(plan):
        tool = plan[view.turn]
        return calls((tool["name"], args_of(tool, view.turn)), turn=view.turn)
    return say(CLAIM)


def _extremes(view: View) -> ChatResponse:
    return _each(view, lambda t, n: {k: _extreme(s) for k, s in properties(t).items()})


def _injections(view: View) -> ChatResponse:
    return _each(view, lambda t, n: {k: INJECTIONS[n % len(INJECTIONS)] for k in properties(t)})


POLICIES = [
    Policy(
        "plugin_extreme_values",
        "call every tool with extreme values of each type",
        _extremes,
        PLUGIN,
    ),  # fmt: skip
    Policy(
        "plugin_injection_strings",
        "call every tool with SQL, path and template injections",
        _injections,
        PLUGIN,
    ),  # fmt: skip
]
