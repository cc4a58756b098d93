"""Plan-time check helpers shared by the templates' `check_config` / `check_task` hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollout.shared.envs.interpolate import placeholder_refs, unclosed_placeholders
from rollout.shared.envs.params import is_json_schema, schema_problems
from rollout.shared.envs.paths import PathError, format_path, parse_path, resolve_path

CONTEXT_ROOTS = ("args", "state", "input")


def placeholder_problems(value: Any, where: str, params: set[str] | None) -> list[str]:
    """Problems of the `${...}` placeholders in value (bad path, unknown root or argument)."""
    problems = [
        f"{where}: placeholder {fragment!r} is never closed (a `}}` is missing)"
        for fragment in unclosed_placeholders(value)
    ]
    for expr in placeholder_refs(value):
        try:
            segments = parse_path(expr)
        except PathError as exc:
            problems.append(f"{where}: bad placeholder ${{{expr}}}: {exc}")
            continue
        root = segments[0]
        if root not in CONTEXT_ROOTS:
            problems.append(
                f"{where}: placeholder ${{{expr}}} must start with one of {', '.join(CONTEXT_ROOTS)}"
            )
        elif root == "args" and len(segments) < 2:
            problems.append(f"{where}: placeholder ${{{expr}}} names no argument")
        elif root == "args" and params is not None and segments[1] not in params:
            problems.append(
                f"{where}: ${{{expr}}} uses argument {segments[1]!r}, "
                f"which paramsSchema does not declare"
            )
    return problems


def declared_params(schema: dict[str, Any] | None) -> set[str] | None:
    """Argument names a paramsSchema declares (None when it declares none)."""
    if schema is None:
        return None
    if is_json_schema(schema):
        return set(schema["properties"])
    return set(schema)


def static_prefix(template: str) -> str:
    """The complete path segments before the first placeholder of a templated path."""
    idx = template.find("${")
    if idx < 0:
        return template
    head = template[:idx]
    if head.endswith(".") or head.endswith("["):
        return head[:-1]
    cut = max(head.rfind("."), head.rfind("["))
    return head[:cut] if cut > 0 else ""


def missing_in(root: dict[str, Any], path: str, noun: str) -> str | None:
    """None when path resolves in root, else a message naming what is missing."""
    try:
        segments = parse_path(path)
    except PathError as exc:
        return str(exc)
    if segments and isinstance(segments[0], str) and segments[0] not in root:
        known = ", ".join(map(repr, root)) or "none"
        return f"no {noun} {segments[0]!r} (known: {known})"
    try:
        resolve_path(root, segments)
    except PathError as exc:
        return f"{format_path(segments)}: {exc}"
    return None


def check_schema(schema: Any, where: str, out: list[str]) -> None:
    """Append the problems of a tool's paramsSchema."""
    for sub, msg in schema_problems(schema):
        step = "" if not sub or sub.startswith("[") else "."  # `["a.b"]` is its own step
        out.append(f"{where}.paramsSchema{step}{sub}: {msg}")


def duplicates(names: list[str], where: Callable[[int], str], what: str, out: list[str]) -> None:
    """Append a problem for each name seen before."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            out.append(f"{where(i)}: duplicate {what} {name!r}")
        seen.add(name)


class quiet:
    """Context manager ignoring path parse errors (they are reported elsewhere)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, *_: Any) -> bool:
        return exc_type is not None and issubclass(exc_type, PathError | IndexError)
