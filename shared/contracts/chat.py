"""Chat messages a prompt may carry (OpenAI's shape), checked with the path of each problem."""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: list[Any], where: str) -> None:
    """ValueError naming `where[i].field` for the first bad message of a chat."""
    calls: set[str] = set()
    for i, message in enumerate(messages):
        _check_message(message, f"{where}[{i}]", first=i == 0, calls=calls)


def _check_message(message: Any, where: str, *, first: bool, calls: set[str]) -> None:
    """One chat message of a prompts file: role, content, tool calls and results."""
    if not isinstance(message, dict):
        raise ValueError(f"{where}: must be a chat message object {{'role': ..., 'content': ...}}")
    unknown = sorted(set(message) - {"role", "content", "tool_calls", "tool_call_id", "name"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"{where}.role: must be one of {', '.join(ROLES)}, got {role!r}")
    if role == "system" and not first:
        raise ValueError(f"{where}.role: a system message may only come first")
    content = message.get("content")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            raise ValueError(f"{where}.tool_calls: only an assistant message calls tools")
        if not isinstance(tool_calls, list) or not tool_calls:
            raise ValueError(f"{where}.tool_calls: must be a non-empty list")
        for j, call in enumerate(tool_calls):
            _check_tool_call(call, f"{where}.tool_calls[{j}]", calls)
    if role == "assistant" and tool_calls:
        if content is not None and not isinstance(content, str):
            raise ValueError(f"{where}.content: must be a string or null")
    elif not isinstance(content, str) or not content.strip():
        raise ValueError(f"{where}.content: must be a non-empty string")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or call_id not in calls:
            raise ValueError(
                f"{where}.tool_call_id: must name a tool call of an earlier assistant message"
            )
    elif "tool_call_id" in message:
        raise ValueError(f"{where}.tool_call_id: only a tool message answers a tool call")


def _check_tool_call(call: Any, where: str, calls: set[str]) -> None:
    if not isinstance(call, dict) or call.get("type", "function") != "function":
        raise ValueError(f"{where}: must be {{'id', 'type': 'function', 'function': ...}}")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"{where}.id: must be a non-empty string")
    function = call.get("function")
    if not isinstance(function, dict):
        raise ValueError(f"{where}.function: must be {{'name': str, 'arguments': str}}")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(f"{where}.function.name: must be a non-empty string")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        raise ValueError(f"{where}.function.arguments: must be a JSON string")
    try:
        json.loads(arguments)
    except ValueError:
        raise ValueError(f"{where}.function.arguments: not JSON text") from None
    calls.add(call_id)
