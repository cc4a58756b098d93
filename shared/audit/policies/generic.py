"""Policies for every template: answer without acting, act with junk, stop, loop."""

from __future__ import annotations

from rollout.shared.audit.policies.base import (
    CLAIM,
    Policy,
    View,
    calls,
    confused,
    ids_in,
    properties,
    say,
    value_like,
)
from rollout.shared.models.base import ChatResponse


def _echo(view: View) -> ChatResponse:
    return say(view.instruction)


def _claim(view: View) -> ChatResponse:
    return say(CLAIM)


def _each_tool(view: View, args_of) -> ChatResponse:  # noqa: ANN001
    tools = view.tools
    if view.turn < len(tools):
        tool = tools[view.turn]
        return calls((tool["name"], args_of(view, tool)), turn=view.turn)
    return say(CLAIM)


def _empty(view: View) -> ChatResponse:
    return _each_tool(view, lambda v, t: {})


def _confused(view: View) -> ChatResponse:
    return _each_tool(view, lambda v, t: {k: confused(s) for k, s in properties(t).items()})


def _borrowed(view: View, tool: dict) -> dict:
    """Arguments from another task's visible input: same-named fields, else its identifiers."""
    other = next((o for o in view.other_inputs if o and o != view.task_input), {}) or {}
    found = [str(v) for v in other.values() if isinstance(v, str | int | float)]
    found += [i for v in other.values() if isinstance(v, str) for i in ids_in(v)]
    return {
        k: other[k] if k in other else value_like(s, found or ["x"])
        for k, s in properties(tool).items()
    }


def _other_tasks(view: View) -> ChatResponse:
    return _each_tool(view, _borrowed)


def _stop(view: View) -> ChatResponse:
    return say("")


def _loop(view: View) -> ChatResponse:
    tools = view.tools
    if not tools:
        return say(CLAIM)
    tool = tools[0]
    args = {k: value_like(s, ids_in(view.instruction)) for k, s in properties(tool).items()}
    return calls((tool["name"], args), turn=view.turn)


def _dump(view: View) -> ChatResponse:
    """Call every tool that needs no argument, then answer with all they said and the task."""
    free = [t for t in view.tools if not (t["parameters"] or {}).get("required")]
    if view.turn < len(free):
        return calls((free[view.turn]["name"], {}), turn=view.turn)
    return say(" ".join([view.instruction, *view.tool_results]))


POLICIES = [
    Policy("echo_instruction", "answer with the instruction's own words", _echo),
    Policy("claim_success", "claim success without acting ('Done, verified')", _claim),
    Policy("empty_arguments", "call every tool once with empty arguments", _empty),
    Policy(
        "type_confused_arguments", "call every tool once with wrong-typed arguments", _confused
    ),  # fmt: skip
    Policy(
        "other_tasks_arguments",
        "call every tool with arguments from another task's input",
        _other_tasks,
    ),  # fmt: skip
    Policy("stop_immediately", "end at once with an empty answer", _stop),
    Policy("loop_one_call", "repeat one tool call until a budget ends the episode", _loop),
    Policy(
        "dump_everything", "call every argument-free tool, answer with all they returned", _dump
    ),  # fmt: skip
]
