"""JSON values cut at a depth, so nothing that walks one recurses without bound.

A tool result comes from environment code and can be shaped by what the model wrote: an
object nested 2,000 deep made every recursive walk of it (the judge's view, the viewer's page,
`json.dumps`, `json.loads`) raise RecursionError, which failed a whole judged group or a page.
Past the limit a value is shown as a string: a marker saying where it was cut, then the start
of its compact JSON text (built here without recursion).
"""

from __future__ import annotations

import json
from typing import Any

# Deep enough for any record a tool means to return; far under the interpreter's recursion
# limit (1,000) and pydantic's (about 200 to parse JSON, 255 to write it).
MAX_DEPTH = 64
# How much of a cut value's JSON text its marker keeps.
CUT_TEXT_CHARS = 200


def cut_marker(limit: int, text: str) -> str:
    """The string a value nested past `limit` is replaced with (`text`: its JSON, cut)."""
    return f"[cut at depth {limit}] {text}"


def compact(value: Any, chars: int = CUT_TEXT_CHARS) -> str:
    """The start of `value`'s compact JSON text (at most `chars`, then "…"), at any depth."""
    out: list[str] = []
    size = 0
    # Each entry is text to write or a value to encode; popped from the end.
    stack: list[tuple[bool, Any]] = [(False, value)]
    while stack and size <= chars:
        is_text, item = stack.pop()
        if is_text:
            piece = item
        elif isinstance(item, dict):
            piece = "{"
            todo: list[tuple[bool, Any]] = [(True, "}")]
            for i, (k, v) in enumerate(reversed(list(item.items()))):
                todo += [(False, v), (True, json.dumps(str(k), ensure_ascii=False) + ":")]
                if i < len(item) - 1:
                    todo.append((True, ","))
            stack += todo
        elif isinstance(item, list | tuple):
            piece = "["
            todo = [(True, "]")]
            for i, v in enumerate(reversed(item)):
                todo.append((False, v))
                if i < len(item) - 1:
                    todo.append((True, ","))
            stack += todo
        else:
            piece = json.dumps(item, ensure_ascii=False, default=str)
        out.append(piece)
        size += len(piece)
    text = "".join(out)
    return text if size <= chars and not stack else text[:chars] + "…"


def bounded(value: Any, limit: int = MAX_DEPTH) -> Any:
    """`value` with each list or object nested past `limit` replaced by its cut marker (a
    copy; `value` itself when nothing is that deep). Walked without recursion."""
    if not _deeper_than(value, limit):
        return value
    root: list[Any] = [None]
    # (value, the container to put its copy in, the key or index there, its depth)
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]
    while stack:
        item, parent, key, depth = stack.pop()
        if isinstance(item, dict | list | tuple) and depth > limit:
            parent[key] = cut_marker(limit, compact(item))
        elif isinstance(item, dict):
            copy: dict[str, Any] = {}
            parent[key] = copy
            for k, v in item.items():
                copy[k] = None
                stack.append((v, copy, k, depth + 1))
        elif isinstance(item, list | tuple):
            items: list[Any] = [None] * len(item)
            parent[key] = items
            stack += [(v, items, i, depth + 1) for i, v in enumerate(item)]
        else:
            parent[key] = item
    return root[0]


_CONTAINERS = (dict, list, tuple)


def _deeper_than(value: Any, limit: int) -> bool:
    # Level by level, only containers kept: a trajectory's long lists of token ids cost one
    # type check each.
    level = [value] if isinstance(value, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            below += [
                c for c in children if c.__class__ in _CONTAINERS or isinstance(c, _CONTAINERS)
            ]
        level = below
    return False


def loads_bounded(text: str | bytes, limit: int = MAX_DEPTH) -> Any:
    """`json.loads(text)` with lists and objects nested past `limit` cut (as `bounded`), even
    where the text nests past what `json.loads` can read."""
    # Too few brackets to nest that deep: nothing to walk (the usual case, and the cheapest).
    if isinstance(text, bytes):
        brackets = text.count(b"[") + text.count(b"{")
    else:
        brackets = text.count("[") + text.count("{")
    if brackets <= limit:
        return json.loads(text)
    try:
        return bounded(json.loads(text), limit)
    except RecursionError:
        pass
    if isinstance(text, bytes):
        text = text.decode()
    return bounded(json.loads(_cut_text(text, limit)), limit)


def _cut_text(text: str, limit: int) -> str:
    """JSON text with each list or object that opens past depth `limit` replaced by its cut
    marker as a JSON string (read character by character: only for text json cannot read)."""
    out: list[str] = []
    depth = 0
    in_string = escaped = False
    start = 0  # where the text not yet copied begins
    cut_at = -1  # where the cut value opened, while inside one
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth == limit + 1 and cut_at < 0:
                out.append(text[start:i])
                cut_at = i
        elif ch in "]}":
            if depth == limit + 1 and cut_at >= 0:
                raw = text[cut_at : i + 1]
                shown = raw if len(raw) <= CUT_TEXT_CHARS else raw[:CUT_TEXT_CHARS] + "…"
                out.append(json.dumps(cut_marker(limit, shown), ensure_ascii=False))
                start, cut_at = i + 1, -1
            depth -= 1
    out.append(text[start:] if cut_at < 0 else text[cut_at:])
    return "".join(out)
