"""Runs inside a plugin host's sandbox: the plugin-protocol face of a user's `rollout_func`.

Shipped as a bundled source (so the worker imports it from the sandbox's /tmp) and imports
nothing of rollout. The factory resolves the user's `module.path:function` with named errors;
the one tool, `rollout`, calls it with the seed prompts and returns at most `limit + 1` rows
(the host side applies the row cap and the `{prompt, answer?}` normalisation).
"""

from __future__ import annotations

import importlib
from typing import Any

_MARK = "rollout_func: "


class _Env:
    def __init__(self, fn: Any, spec: str, limit: int) -> None:
        self.fn = fn
        self.spec = spec
        self.limit = limit

    def tools(self) -> list[dict[str, Any]]:
        return [{"name": "rollout", "description": "call the rollout_func", "parameters": {}}]

    def reset(self, task: dict[str, Any]) -> None:
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def step(self, name: str, arguments: dict[str, Any]) -> Any:
        raw = self.fn(list(arguments.get("prompts") or []))
        if raw is None or isinstance(raw, str | bytes | dict) or not hasattr(raw, "__iter__"):
            raise TypeError(
                f"{_MARK}{self.spec!r} must return an iterable of row mappings, "
                f"got {type(raw).__name__}"
            )
        rows = []
        for row in raw:
            rows.append(_carry(row))
            if len(rows) > self.limit:
                break
        return {"rows": rows}


def _carry(row: Any) -> dict[str, Any]:
    # Only prompt and answer travel; their Python types ride along for the host's messages.
    if not hasattr(row, "keys") or not hasattr(row, "get"):
        return {"__not_a_mapping__": type(row).__name__}
    prompt, answer = row.get("prompt"), row.get("answer")
    return {
        "prompt": prompt if isinstance(prompt, str | list) else None,
        "answer": answer if isinstance(answer, str) or answer is None else 0,
        "__types__": {"prompt": type(prompt).__name__, "answer": type(answer).__name__},
    }


def factory(options: dict[str, Any]) -> _Env:
    """Resolve options['rollout_func'] (shape already checked by the host side)."""
    spec = str(options["rollout_func"])
    module_path, _, fn_name = spec.partition(":")
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise ValueError(f"{_MARK}module {module_path!r} could not be imported: {exc}") from None
    if not hasattr(module, fn_name):
        raise ValueError(f"{_MARK}{spec!r}: module {module_path!r} has no attribute {fn_name!r}")
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise ValueError(
            f"{_MARK}{spec!r}: resolved attribute is not callable ({type(fn).__name__})"
        )
    return _Env(fn, spec, int(options.get("limit") or 100_000))
