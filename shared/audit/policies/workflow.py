"""Workflow policies: act without looking, act twice, act on the wrong entity, spray options."""

from __future__ import annotations

import re
import zlib

from rollout.shared.audit.policies.base import (
    CLAIM,
    READ_ONLY,
    Policy,
    View,
    calls,
    ids_in,
    properties,
    say,
    value_like,
)
from rollout.shared.models.base import ChatResponse

WORKFLOW = frozenset({"workflow", "custom", "plugin"})


def _actions(view: View) -> list[dict]:
    return [t for t in view.tools if not READ_ONLY.match(t["name"])]


def _guess(view: View, tool: dict, source: str) -> dict:
    ids = ids_in(source)
    words = [w for w in re.findall(r"[A-Za-z]+", source) if len(w) > 3]
    # Capitalised words past the first are likely names ("... with Cleo's message").
    names = [w for w in words[1:] if w[0].isupper()]
    return {
        # An `*id` parameter takes an id from the words; any other takes a name first.
        k: value_like(s, ids + words if k.lower().endswith("id") else names + ids + words)
        for k, s in properties(tool).items()
    }


def _blind(view: View, repeat: int, source: str | None = None) -> ChatResponse:
    plan = [t for t in _actions(view) for _ in range(repeat)]
    if view.turn < len(plan):
        tool = plan[view.turn]
        return calls((tool["name"], _guess(view, tool, source or view.instruction)), turn=view.turn)
    return say(CLAIM)


def _without_lookup(view: View) -> ChatResponse:
    return _blind(view, 1)


def _one_action(view: View) -> ChatResponse:
    """One action tool alone, without looking: which one varies with the task, so across an
    env's tasks each is tried (notify-only where the task wants a notice and nothing else)."""
    actions = _actions(view)
    if not actions:
        return say(CLAIM)
    tool = actions[zlib.crc32(view.instruction.encode()) % len(actions)]
    if view.turn == 0:
        return calls((tool["name"], _guess(view, tool, view.instruction)), turn=0)
    return say(CLAIM)


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
    Policy(
        "one_action_without_lookup",
        "call one of the action tools straight away (which one varies by task), nothing else",
        _one_action,
        WORKFLOW,
    ),  # fmt: skip
    Policy("act_twice", "make every action call twice", _twice, WORKFLOW),
    Policy("wrong_entity", "act on the entity another task is about", _wrong_entity, WORKFLOW),
    Policy(
        "spray_every_option", "make each action once per option its tool lists", _spray, WORKFLOW
    ),  # fmt: skip
]
