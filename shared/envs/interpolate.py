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
from collections.abc import Callable, Iterator
from typing import Any

from rollout.shared.envs.paths import (
    PathError,
    json_copy,
    parse_cached,
    parse_path,
    resolve_path,
)

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
    return _resolve(expr, segments, context)


def _resolve(expr: str, segments: tuple[Any, ...], context: dict[str, Any]) -> Any:
    root = segments[0]
    if not isinstance(root, str) or root not in context:
        roots = ", ".join(sorted(context)) or "none"
        raise InterpolationError(f"${{{expr}}}: unknown root {root!r} (known: {roots})")
    try:
        return resolve_path(context[root], segments[1:])
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
    """Interpolate every string inside a JSON value (dict values, list items); keys stay as is.

    Walked with a stack, in order (the first bad placeholder is the one named), not by
    recursion: a value nested thousands deep is interpolated, never a RecursionError.
    """
    if not isinstance(value, dict | list | tuple):
        return _interpolated_leaf(value, context)
    root: Any = {} if isinstance(value, dict) else []
    # Each container being filled, with what is left of its source's items.
    pending: list[tuple[Iterator[tuple[Any, Any]], Any]] = [(_items(value), root)]
    while pending:
        items, target = pending[-1]
        step = next(items, None)
        if step is None:
            pending.pop()
            continue
        key, item = step
        if isinstance(item, dict | list | tuple):
            made: Any = {} if isinstance(item, dict) else []
            pending.append((_items(item), made))
        else:
            made = _interpolated_leaf(item, context)
        if isinstance(target, dict):
            target[key] = made
        else:
            target.append(made)
    return root


def _items(value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> Iterator[tuple[Any, Any]]:
    return iter(value.items()) if isinstance(value, dict) else enumerate(value)


def _interpolated_leaf(value: Any, context: dict[str, Any]) -> Any:
    """`interpolate` of a value that is no dict, list or tuple."""
    if isinstance(value, str):
        return interpolate_string(value, context)
    return _copy(value)


_SCALARS = (str, int, float, bool, type(None))
_MISSING = object()

Compiled = Callable[[dict[str, Any]], Any]


def compile_template(value: Any) -> Compiled:
    """`interpolate(value, ctx)` as a function of ctx, with the placeholders parsed once.

    For a template used on every call of a tool; the errors are interpolate's, raised when
    the function runs. The template must not change afterwards (config is immutable).
    """
    if isinstance(value, str):
        return _compile_string(value)
    if isinstance(value, dict):
        items = [(k, compile_template(v)) for k, v in value.items()]

        def run_dict(ctx: dict[str, Any]) -> dict[Any, Any]:
            out = {}  # a loop, not a comprehension: no frame of its own on 3.11
            for k, part in items:
                out[k] = part(ctx)
            return out

        return run_dict
    if isinstance(value, list | tuple):
        parts = [compile_template(v) for v in value]
        return lambda ctx: [part(ctx) for part in parts]
    if isinstance(value, _SCALARS):
        return lambda ctx: value
    return lambda ctx: copy.deepcopy(value)


def _compile_string(text: str) -> Compiled:
    if "$" not in text:
        return lambda ctx: text
    whole = _WHOLE.match(text)
    if whole is None:  # text around placeholders: the general path
        return lambda ctx: interpolate_string(text, ctx)
    expr = whole.group(1).strip()
    try:
        segments = parse_cached(expr)
    except PathError:  # raise the same error as interpolate, when it runs
        return lambda ctx: interpolate_string(text, ctx)

    root, rest = segments[0], segments[1:]
    if not isinstance(root, str) or not all(isinstance(seg, str) for seg in rest):
        return lambda ctx: _copy(_resolve(expr, segments, ctx))

    if len(rest) == 1:  # `${args.x}`: one key under a root
        key = rest[0]

        def run_key(ctx: dict[str, Any]) -> Any:
            base = ctx.get(root)
            found = base.get(key, _MISSING) if type(base) is dict else _MISSING
            if found is _MISSING:
                found = _resolve(expr, segments, ctx)
            return found if isinstance(found, _SCALARS) else json_copy(found)

        return run_key

    def run(ctx: dict[str, Any]) -> Any:
        # `${args.x}` through plain dicts (the usual case) inline; anything else (an index,
        # `.length`, a miss and its error) the general way.
        found = ctx.get(root, _MISSING)
        for seg in rest:
            if type(found) is dict and seg in found:
                found = found[seg]
            else:
                found = _resolve(expr, segments, ctx)
                break
        if found is _MISSING:
            found = _resolve(expr, segments, ctx)
        return found if isinstance(found, _SCALARS) else json_copy(found)

    return run


def _copy(value: Any) -> Any:
    # Results must not alias args or state; scalars are immutable, so skip copying them.
    # json_copy, not deepcopy: a state value nested thousands deep is copied all the same.
    return value if isinstance(value, _SCALARS) else json_copy(value)


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value (dict values, list items), in order."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def unclosed_placeholders(value: Any) -> list[str]:
    """Every `${` in a JSON value's strings that no `}` closes (shown from there, shortened)."""
    found: list[str] = []
    for text in _strings(value):
        rest = _PLACEHOLDER.sub("", text)
        if (start := rest.find("${")) >= 0:
            found.append(rest[start : start + 40])
    return found


def placeholder_refs(value: Any) -> list[str]:
    """Every placeholder expression in a JSON value, in order (escaped ones excluded)."""
    return [
        m.group(2).strip()
        for text in _strings(value)
        for m in _PLACEHOLDER.finditer(text)
        if not m.group(1)
    ]


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
