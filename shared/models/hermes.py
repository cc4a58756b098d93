"""Hermes-style tool calls in generated text: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`."""

from __future__ import annotations

import json
import re

from rollout.shared.models.base import ToolCall

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)
# Best effort to name the tool in a call whose JSON is broken, so the error reads well.
_NAME_HINT = re.compile(r'"name"\s*:\s*"([^"\\]{1,128})"')


def parse_tool_calls(text: str, *, id_prefix: str = "call") -> tuple[str | None, list[ToolCall]]:
    """Split generated text into its plain content and its tool calls.

    A block whose body is not a JSON object with a string `name` comes back as a ToolCall
    with `error` set (and a name when one can be recovered); an opening tag without a
    closing one (generation cut off) is reported the same way. Never raises.
    """
    calls: list[ToolCall] = []
    for match in _BLOCK.finditer(text):
        calls.append(_parse_block(match.group(1), f"{id_prefix}_{len(calls)}"))
    rest = _BLOCK.sub("", text)
    if OPEN_TAG in rest:
        head, _, tail = rest.partition(OPEN_TAG)
        call = _parse_block(tail, f"{id_prefix}_{len(calls)}")
        calls.append(
            ToolCall(
                id=call.id,
                name=call.name,
                arguments=tail.strip(),
                error=f"malformed tool call: '{OPEN_TAG}' without '{CLOSE_TAG}'",
            )
        )
        rest = head
    content = rest.strip()
    return (content or None), calls


def _parse_block(body: str, call_id: str) -> ToolCall:
    raw = body.strip()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        hint = _NAME_HINT.search(raw)
        return ToolCall(
            id=call_id,
            name=hint.group(1) if hint else "",
            arguments=raw,
            error=f"malformed tool call: invalid JSON ({exc.msg} at char {exc.pos})",
        )
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return ToolCall(
            id=call_id,
            name="",
            arguments=raw,
            error='malformed tool call: expected {"name": "<tool>", "arguments": {...}}',
        )
    arguments = data.get("arguments", data.get("parameters", {}))
    # Arguments may be an object or a JSON string of one; keep the model's text either way
    # and let the agent loop judge it, as it does for API models.
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(id=call_id, name=data["name"], arguments=text)


def render_tool_call(name: str, arguments: dict | str) -> str:
    """The text a model should emit to call `name` (used for training data and tests)."""
    args = json.loads(arguments) if isinstance(arguments, str) and arguments else arguments
    return f"{OPEN_TAG}\n{json.dumps({'name': name, 'arguments': args or {}})}\n{CLOSE_TAG}"
