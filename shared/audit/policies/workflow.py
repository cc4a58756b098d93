"""Workflow policies: act without looking, act twice, act on the wrong entity, spray options."""

from __future__ import annotations

import re

from rollout.shared.audit.policies.base import (
    CLAIM,
    Policy,
    View,
    calls,
    ids_in,
    properties,
    say,
    value_like,
)
from rollout.shared.models.base import ChatResponse

READ_ONLY = re.compile(r"^(get|lookup|look_up|read|list|check|describe|search|find|show|view)")
WORKFLOW = frozenset({"workflow", "custom", "plugin"})


def _actions(view: View) -> list[dict]:
    return [t for t in view.tools if not READ_ONLY.match(t["name"])]


def _guess(view: View, tool: dict, source: str) -> dict:
    found = ids_in(source) + [w for w in re.findall(r"[A-Za-z]+", source) if len(w) > 3]
    return {k: value_like(s, found) for k, s in properties(tool).items()}


def _blind(view: View, repeat: int, source: str | None = None) -> ChatResponse:
    plan = [t for t in _actions(view) for _ in range(repeat)]
    if view.turn < len(plan):
        tool = plan[view.turn]
        return calls((tool["name"], _guess(view, tool, source or view.instruction)), turn=view.turn)
    return say(CLAIM)


def _without_lookup(view: View) -> ChatResponse:
    return _blind(view, 1)


def _twice(view: View) -> ChatResponse:
    return _blind(view, 2)


def _wrong_entity(view: View) -> ChatResponse:
    other = next((o for o in view.other_inputs if o and o != view.task_input), {}) or {}
    text = " ".join(str(v) for v in other.values())
    return _blind(view, 1, text or "X-0")


def _spray(view: View) -> ChatResponse:
    """Each action tool once per option its description or schema lists (every team, ...)."""
    plan = []
    for tool in _actions(view):
        for name, schema in properties(tool).items():
            options = schema.get("enum") or _listed(view, tool["name"])
            plan += [(tool["name"], {name: option}) for option in options]
    if view.turn < len(plan):
        return calls(plan[view.turn], turn=view.turn)
    return say(CLAIM)


def _listed(view: View, name: str) -> list[str]:
    # "Send the ticket to a team: billing, shipping, technical or account."
    for tool in view.request.tools or []:
        fn = tool.get("function", tool)
        if fn.get("name") == name:
            text = str(fn.get("description") or "")
            tail = text.split(":", 1)[1] if ":" in text else ""
            return [
                w for w in re.split(r",\s*|\s+or\s+|\.", tail) if w.strip() and " " not in w.strip()
            ]
    return []


POLICIES = [
    Policy(
        "act_without_lookup",
        "call the action tools straight away, guessing from the words",
        _without_lookup,
        WORKFLOW,
    ),  # fmt: skip
    Policy("act_twice", "make every action call twice", _twice, WORKFLOW),
    Policy("wrong_entity", "act on the entity another task is about", _wrong_entity, WORKFLOW),
    Policy(
        "spray_every_option", "make each action once per option its tool lists", _spray, WORKFLOW
    ),  # fmt: skip
]
