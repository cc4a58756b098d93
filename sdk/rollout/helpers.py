"""Builders for the platform's JSON shapes, so users don't hand-roll camelCase dicts.

Every helper returns a plain dict with the seed's camelCase keys; pass them to `Environment`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic.alias_generators import to_camel


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    """Drop unset (None) keys so the payload only says what the user said."""
    return {k: v for k, v in d.items() if v is not None}


def lookup_tool(
    name: str,
    *,
    from_array: str | None = None,
    match_field: str | None = None,
    match_arg: str | None = None,
    fixture_path: str | None = None,
    description: str = "",
    params_schema: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A workflow tool that reads fixtures: `fromArray` + `matchField`, or a `fixturePath`."""
    return _clean(
        {
            "name": name,
            "kind": "lookup",
            "description": description,
            "fromArray": from_array,
            "matchField": match_field,
            "matchArg": match_arg,
            "fixturePath": fixture_path,
            "paramsSchema": dict(params_schema) if params_schema is not None else None,
        }
    )


def action_tool(
    name: str,
    *,
    state_array: str | None = None,
    append_to: str | None = None,
    value: Any = None,
    response: Any = None,
    description: str = "",
    params_schema: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A workflow tool that appends to a state array (the arguments, or a templated `value`)."""
    return _clean(
        {
            "name": name,
            "kind": "action",
            "description": description,
            "stateArray": state_array,
            "appendTo": append_to,
            "value": value,
            "response": response,
            "paramsSchema": dict(params_schema) if params_schema is not None else None,
        }
    )


def mock_tool(
    name: str,
    *,
    response: Any = None,
    description: str = "",
    params_schema: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A workflow tool that returns a canned (templated) response and changes nothing."""
    return _clean(
        {
            "name": name,
            "kind": "mock",
            "description": description,
            "response": response,
            "paramsSchema": dict(params_schema) if params_schema is not None else None,
        }
    )


def workflow_config(
    tools: Iterable[Mapping[str, Any]],
    fixtures: Mapping[str, Any] | None = None,
    initial_mutable_state: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Config of the `workflow` template."""
    return {
        "tools": [dict(t) for t in tools],
        "fixtures": dict(fixtures or {}),
        "initialMutableState": dict(initial_mutable_state or {}),
    }


def custom_tool(
    name: str,
    *,
    description: str = "",
    params_schema: Mapping[str, Any] | None = None,
    response: Any = None,
    mutates: Any = None,
) -> dict[str, Any]:
    """A custom tool: templated `response`; `mutates` is "path", "name[]", {path, value} or a list."""
    return _clean(
        {
            "name": name,
            "description": description,
            "paramsSchema": dict(params_schema) if params_schema is not None else None,
            "response": response,
            "mutates": mutates,
        }
    )


def custom_config(
    tools: Iterable[Mapping[str, Any]],
    initial_state: Mapping[str, Any] | None = None,
    *,
    initial_mutable_state: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Config of the `custom` template."""
    state = initial_mutable_state if initial_mutable_state is not None else initial_state
    return {"tools": [dict(t) for t in tools], "initialMutableState": dict(state or {})}


def code_editing_config(
    files: Mapping[str, str],
    *,
    test_command: list[str] | str | None = None,
    test_timeout_seconds: float | None = None,
    memory_mb: int | None = None,
    test_isolation: str | None = None,
    disk_mb: int | None = None,
) -> dict[str, Any]:
    """Config of the `code-editing` template: files, and the command that runs the tests.

    `test_isolation`: "process" (the default: the model's code runs in a sandbox of its own
    while `tests_pass` runs the hidden tests) or "in-process" (imported into the tests' process).
    `disk_mb`: what one test run may write to its folders (default 512); past it the run fails.
    """
    return _clean(
        {
            "files": dict(files),
            "testCommand": test_command,
            "testTimeoutSeconds": test_timeout_seconds,
            "memoryMb": memory_mb,
            "diskMb": disk_mb,
            "testIsolation": test_isolation,
        }
    )


def sql_config(schema: str, seed: str = "") -> dict[str, Any]:
    """Config of the `sql` template: DDL plus optional INSERTs."""
    return {"schema": schema, "seed": seed}


def plugin_config(entrypoint: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Config of a Python plugin environment (`module.path:function`)."""
    return {"entrypoint": entrypoint, "options": dict(options or {})}


def browser_page(
    url: str,
    elements: Iterable[Mapping[str, Any]] | None = None,
    *,
    title: str = "",
    text: str = "",
) -> dict[str, Any]:
    """One mock page; elements are dicts with `id`, `type` (text/link/input/button/form)..."""
    return {
        "url": url,
        "title": title,
        "text": text,
        "elements": [{to_camel(k): v for k, v in dict(e).items()} for e in elements or []],
    }


def browser_config(
    pages: Iterable[Mapping[str, Any]], initial_url: str | None = None
) -> dict[str, Any]:
    """Config of the `browser` template; the agent starts at `initial_url` (default: page 1)."""
    pages = [dict(p) for p in pages]
    start = initial_url if initial_url is not None else (pages[0]["url"] if pages else None)
    return _clean({"pages": pages, "initialUrl": start})


def primitive(name: str, type: str, weight: float = 1.0, **params: Any) -> dict[str, Any]:
    """One verifier primitive; keyword params may be snake_case (`min_count` -> `minCount`)."""
    out: dict[str, Any] = {"name": name, "type": type, "weight": weight}
    for key, value in params.items():
        out[to_camel(key)] = value
    return out


def verifier_config(*primitives: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> dict:
    """The verifier: primitives given one by one or as one list."""
    items: list[dict[str, Any]] = []
    for p in primitives:
        if isinstance(p, Mapping):
            items.append(dict(p))
        else:
            items.extend(dict(x) for x in p)
    return {"primitives": items}


__all__ = [
    "action_tool",
    "browser_config",
    "browser_page",
    "code_editing_config",
    "custom_config",
    "custom_tool",
    "lookup_tool",
    "mock_tool",
    "plugin_config",
    "primitive",
    "sql_config",
    "verifier_config",
    "workflow_config",
]
