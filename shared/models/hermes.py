"""Tool calls in generated text: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.

Small local models do not always write the tags: a bare JSON call (`{"name": ..., "arguments":
...}` anywhere in the reply, or in a ``` code fence) counts too, and a tag body may hold a JSON
list of calls. Anything that is recognisably an attempted call but cannot be read becomes a
ToolCall with `error` set, which the agent loop shows the model as a tool error.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollout.shared.models.base import ToolCall

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

_BLOCK = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)
# Best effort to name the tool in a call whose JSON is broken, so the error reads well.
_NAME_HINT = re.compile(r'"name"\s*:\s*"([^"\\]{1,128})"')
# A bare attempt at a call: an object opening with a "name" key, with arguments after it.
_BARE_START = re.compile(r'\{\s*"name"\s*:')
_EMPTY_FENCE = re.compile(r"```[A-Za-z]*\s*```")
_DECODER = json.JSONDecoder()
_SHAPE = 'malformed tool call: expected {"name": "<tool>", "arguments": {...}}'


def parse_tool_calls(text: str, *, id_prefix: str = "call") -> tuple[str | None, list[ToolCall]]:
    """Split generated text into its plain content and its tool calls.

    A block whose body is not a JSON object with a string `name` (or a list of them) comes
    back as a ToolCall with `error` set (and a name when one can be recovered); an opening tag
    without a closing one is read when its JSON is complete, reported otherwise. Without tags,
    bare JSON calls are read the same way. Never raises.
    """
    calls: list[ToolCall] = []
    counter = iter(range(1 << 30))

    def next_id() -> str:
        return f"{id_prefix}_{next(counter)}"

    for match in _BLOCK.finditer(text):
        calls.extend(_parse_block(match.group(1), next_id))
    rest = _BLOCK.sub("", text)
    if OPEN_TAG in rest:
        head, _, tail = rest.partition(OPEN_TAG)
        calls.extend(_parse_unclosed(tail, next_id))
        rest = head
    if not calls:
        rest = _bare_calls(rest, calls, next_id)
    content = rest.strip()
    return (content or None), calls


def _why(exc: ValueError | RecursionError) -> str:
    """What is wrong with a call's JSON: a decode error, or one Python will not read (an
    integer of 4,301+ digits raises a plain ValueError, with no msg or pos to name)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at char {exc.pos}"
    return str(exc)[:200]


def _parse_block(body: str, next_id: Any) -> list[ToolCall]:
    raw = body.strip()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # nested past the recursion limit: malformed
        return [_broken(raw, next_id(), f"invalid JSON ({_why(exc)})")]
    if isinstance(data, list) and data and all(isinstance(d, dict) for d in data):
        return [_call(item, json.dumps(item), next_id()) for item in data]
    return [_call(data, raw, next_id())]


def _parse_unclosed(tail: str, next_id: Any) -> list[ToolCall]:
    raw = tail.strip()
    try:
        data, end = _DECODER.raw_decode(raw)
    except (ValueError, RecursionError):
        data, end = None, -1
    if isinstance(data, dict) and not raw[end:].strip():
        # The model stopped right after a complete call (its end token ends the turn).
        return [_call(data, raw[:end], next_id())]
    call = _broken(raw, next_id(), "")
    call.error = f"malformed tool call: '{OPEN_TAG}' without '{CLOSE_TAG}'"
    return [call]


def _bare_calls(text: str, calls: list[ToolCall], next_id: Any) -> str:
    # Calls written as bare JSON objects; what remains is the content.
    kept: list[str] = []
    position = 0
    for match in _BARE_START.finditer(text):
        start = match.start()
        if start < position:
            continue  # inside a call already read
        try:
            data, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError) as exc:
            raw = text[start:].strip()
            if '"arguments"' in raw or '"parameters"' in raw:
                kept.append(text[position:start])
                calls.append(_broken(raw, next_id(), f"invalid JSON ({_why(exc)})"))
                position = len(text)
                break
            continue
        if isinstance(data, dict) and ("arguments" in data or "parameters" in data):
            kept.append(text[position:start])
            calls.append(_call(data, text[start:end], next_id()))
            position = end
    kept.append(text[position:])
    return _EMPTY_FENCE.sub("", "".join(kept))


def _call(data: Any, raw: str, call_id: str) -> ToolCall:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return ToolCall(id=call_id, name="", arguments=raw, error=_SHAPE)
    arguments = data.get("arguments", data.get("parameters", {}))
    # Arguments may be an object or a JSON string of one; keep the model's text either way
    # and let the agent loop judge it, as it does for API models.
    try:
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    except RecursionError:
        return _broken(raw, call_id, "arguments nested too deep")
    return ToolCall(id=call_id, name=data["name"], arguments=text)


def _broken(raw: str, call_id: str, why: str) -> ToolCall:
    hint = _NAME_HINT.search(raw)
    return ToolCall(
        id=call_id,
        name=hint.group(1) if hint else "",
        arguments=raw,
        error=f"malformed tool call: {why}",
    )


def render_tool_call(name: str, arguments: dict | str) -> str:
    """The text a model should emit to call `name` (used for training data and tests)."""
    args = json.loads(arguments) if isinstance(arguments, str) and arguments else arguments
    return f"{OPEN_TAG}\n{json.dumps({'name': name, 'arguments': args or {}})}\n{CLOSE_TAG}"
