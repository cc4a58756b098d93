"""An adversarial policy: a scripted agent that tries to pass a task without doing it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollout.shared.models.base import ChatRequest, ChatResponse, ToolCall

# Words that claim the work is done, for policies that answer without acting.
CLAIM = "Done: I have completed the task as requested and verified the result. Success."
# Tool names that read rather than act.
READ_ONLY = re.compile(r"^(get|lookup|look_up|read|list|check|describe|search|find|show|view)")


@dataclass(frozen=True)
class View:
    """What a policy sees at one turn: the chat so far and the task's visible data.

    Never the task's hidden ground truth: an adversary knows what a model would know (the
    instruction, the tools, what the tools answered, other tasks' visible inputs).
    """

    turn: int
    request: ChatRequest
    instruction: str
    task_input: dict[str, Any]
    other_inputs: list[dict[str, Any]]
    template: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools offered, as `{name, parameters}` (OpenAI's function schema)."""
        out = []
        for tool in self.request.tools or []:
            fn = tool.get("function", tool)
            out.append({"name": fn.get("name", ""), "parameters": fn.get("parameters") or {}})
        return out

    def tool(self, name: str) -> dict[str, Any] | None:
        """The tool called `name`, if offered."""
        return next((t for t in self.tools if t["name"] == name), None)

    @property
    def tool_results(self) -> list[str]:
        """What each tool call returned so far, in order."""
        return [
            str(m.get("content") or "") for m in self.request.messages if m.get("role") == "tool"
        ]


Act = Callable[[View], ChatResponse]


@dataclass(frozen=True)
class Policy:
    """A named adversarial policy, the templates it applies to (None: all) and how it acts."""

    name: str
    description: str
    act: Act
    templates: frozenset[str] | None = None

    def applies_to(self, template: str) -> bool:
        """True when this policy is worth running on an env of `template`."""
        return self.templates is None or template in self.templates


def calls(*pairs: tuple[str, dict[str, Any]], turn: int = 0) -> ChatResponse:
    """A response making the given tool calls."""
    return ChatResponse(
        tool_calls=[
            ToolCall(id=f"call_{turn}_{i}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(pairs)
        ],
        finish_reason="tool_calls",
    )


def say(text: str) -> ChatResponse:
    """A final answer with no tool call."""
    return ChatResponse(content=text)


def script(steps: list[ChatResponse | None], final: str = CLAIM) -> Act:
    """A policy that plays `steps` one per turn (None entries skipped), then answers `final`."""
    steps = [s for s in steps if s is not None]

    def act(view: View) -> ChatResponse:
        return steps[view.turn] if view.turn < len(steps) else say(final)

    return act


def properties(tool: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A tool's parameters by name (an empty schema: none)."""
    props = (tool.get("parameters") or {}).get("properties") or {}
    return {k: (v if isinstance(v, dict) else {}) for k, v in props.items()}


def confused(schema: dict[str, Any]) -> Any:
    """A value of the wrong type for a parameter's schema."""
    kind = schema.get("type")
    if kind in ("integer", "number"):
        return "not-a-number"
    if kind == "boolean":
        return "maybe"
    if kind in ("array", "object"):
        return 12345
    return {"unexpected": ["object"]}


IDS = re.compile(r"\b[A-Z]{1,4}-\d+\b|\b\d+\b")


def ids_in(text: str) -> list[str]:
    """Identifier-like tokens of a text (O-12, SKU-3, 42), in order."""
    return IDS.findall(text or "")


def value_like(schema: dict[str, Any], candidates: list[Any]) -> Any:
    """The first candidate that fits a parameter's type (a guess, never the hidden answer)."""
    kind = schema.get("type")
    for value in candidates:
        if kind in ("integer", "number"):
            try:
                return int(value) if kind == "integer" else float(value)
            except (TypeError, ValueError):
                continue
        elif kind in (None, "string"):
            return str(value)
    return 1 if kind in ("integer", "number") else ("x" if kind in (None, "string") else None)
