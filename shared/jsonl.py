"""One reader for JSON Lines files: an env's tasks, a prompts file, a snapshot, a staged dataset.

Each line is one JSON object. A byte-order mark (what Windows editors and spreadsheets write
first) is not part of line 1; lines end at "\\n" only ("\\r\\n" too: "\\r" is JSON whitespace).
Never str.splitlines: it also cuts at U+2028, U+2029 and U+0085, which a JSON string holds
unescaped (json.dumps(ensure_ascii=False) writes them so), tearing a valid line in two.

A bad file raises JsonlError naming where, the line, the column where there is one, and the
problem: `tasks.jsonl:2: not UTF-8 text: byte 0xe9 at column 21 (save the file as UTF-8)`,
`tasks.jsonl:3: not JSON: Expecting ',' delimiter at column 17`,
`tasks.jsonl:4: each line must be a JSON object, not an array`. Blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollout.shared.errors import RolloutError

_BOM = b"\xef\xbb\xbf"
_KINDS = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}


class JsonlError(RolloutError, ValueError):
    """A JSON Lines file that cannot be read as one object a line.

    A RolloutError (the CLI prints it, no traceback) and a ValueError, as json's own errors
    are (code that turns a bad dataset's ValueError into a failed job keeps doing so).
    """


def read_jsonl(path: Path, where: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each line of the file at `path` (named `where`, else the path)."""
    name = where if where is not None else str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise JsonlError(f"{name}: cannot read: {exc.strerror or exc}") from None
    return jsonl_objects(data, name)


def jsonl_objects(data: bytes, where: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of JSON Lines `data`, first to last.

    The whole text is decoded before the first line is yielded: a file that is not UTF-8
    fails before any of its lines is used.
    """
    data = data.removeprefix(_BOM)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # The line and column, not the byte offset into a file of thousands of lines.
        start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, start) + 1
        column = len(data[start : exc.start].decode("utf-8")) + 1
        raise JsonlError(
            f"{where}:{line}: not UTF-8 text: byte 0x{data[exc.start]:02x} at column {column}"
            " (save the file as UTF-8)"
        ) from None
    return _objects(text.split("\n"), where)


def _objects(lines: list[str], where: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip(" \t\r"):  # JSON's whitespace: any other character is not JSON
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JsonlError(
                f"{where}:{number}: not JSON: {exc.msg} at column {exc.colno}"
            ) from None
        except RecursionError:  # arrays or objects nested thousands deep
            raise JsonlError(f"{where}:{number}: not JSON: nested too deeply to read") from None
        if not isinstance(value, dict):
            kind = _KINDS.get(type(value), "a number")
            raise JsonlError(f"{where}:{number}: each line must be a JSON object, not {kind}")
        yield number, value
