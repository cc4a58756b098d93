"""`${args.x}` templating over JSON values.

A placeholder that is the whole string keeps the value's type (`"${args.amount}"` with amount 100
is the number 100); placeholders inside longer text are stringified (JSON for non-strings).
`$${...}` is a literal `${...}`. Substitution is one pass, so argument values are never
themselves interpolated.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from rollout.shared.envs.paths import PathError, parse_cached, parse_path, resolve_path

_PLACEHOLDER = re.compile(r"\$(\$?)\{([^{}]*)\}")
_WHOLE = re.compile(r"^\$\{([^{}]*)\}$")


class InterpolationError(ValueError):
    """A placeholder that does not parse or whose value is missing."""


def _lookup(expr: str, context: dict[str, Any]) -> Any:
    expr = expr.strip()
    try:
        segments = parse_cached(expr)
    except PathError as exc:
        raise InterpolationError(f"${{{expr}}}: {exc}") from None
    root = segments[0]
    if not isinstance(root, str) or root not in context:
        roots = ", ".join(sorted(context)) or "none"
        raise InterpolationError(f"${{{expr}}}: unknown root {root!r} (known: {roots})")
    try:
        return resolve_path(context[root], list(segments[1:]))
    except PathError as exc:
        if root == "args" and len(segments) == 2:
            raise InterpolationError(f"${{{expr}}}: missing argument {segments[1]!r}") from None
        raise InterpolationError(f"${{{expr}}}: {exc}") from None


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def interpolate_string(text: str, context: dict[str, Any]) -> Any:
    """Interpolate one string; a whole-string placeholder returns the value with its type."""
    if "$" not in text:
        return text
    whole = _WHOLE.match(text)
    if whole:
        return _copy(_lookup(whole.group(1), context))

    def sub(m: re.Match[str]) -> str:
        if m.group(1):  # `$${x}` escapes to the literal `${x}`
            return "${" + m.group(2) + "}"
        return _to_text(_lookup(m.group(2), context))

    return _PLACEHOLDER.sub(sub, text)


def interpolate(value: Any, context: dict[str, Any]) -> Any:
    """Interpolate every string inside a JSON value (dict values, list items); keys stay as is."""
    if isinstance(value, str):
        return interpolate_string(value, context)
    if isinstance(value, dict):
        return {k: interpolate(v, context) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [interpolate(v, context) for v in value]
    return _copy(value)


_SCALARS = (str, int, float, bool, type(None))


def _copy(value: Any) -> Any:
    # Results must not alias args or state; scalars are immutable, so skip deepcopy for them.
    return value if isinstance(value, _SCALARS) else copy.deepcopy(value)


def placeholder_refs(value: Any) -> list[str]:
    """Every placeholder expression in a JSON value, in order (escaped ones excluded)."""
    found: list[str] = []
    if isinstance(value, str):
        for m in _PLACEHOLDER.finditer(value):
            if not m.group(1):
                found.append(m.group(2).strip())
    elif isinstance(value, dict):
        for v in value.values():
            found.extend(placeholder_refs(v))
    elif isinstance(value, list | tuple):
        for v in value:
            found.extend(placeholder_refs(v))
    return found


def arg_names(value: Any) -> list[str]:
    """Names of the `args.X` a JSON template refers to, first-seen order."""
    names: list[str] = []
    for expr in placeholder_refs(value):
        try:
            segments = parse_path(expr)
        except PathError:
            continue
        if len(segments) >= 2 and segments[0] == "args" and isinstance(segments[1], str):
            if segments[1] not in names:
                names.append(segments[1])
    return names
