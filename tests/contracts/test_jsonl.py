"""The one JSON Lines reader (rollout.shared.jsonl): what it reads, and how a bad line is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.errors import RolloutError
from rollout.shared.contracts.snapshot import rows_from_jsonl
from rollout.shared.jsonl import JsonlError, jsonl_objects, read_jsonl


def test_a_bom_crlf_blank_lines_and_unicode_line_separators_are_read() -> None:
    # JSON leaves U+2028/9 and NEL unescaped: str.splitlines would cut line 3 in two.
    text = "a\u2028b\u2029c\x85d"
    data = (
        b"\xef\xbb\xbf" + b'{"n": 1}\r\n' + b"\n  \t\r\n"
        + json.dumps({"n": 3, "text": text}, ensure_ascii=False).encode() + b"\n"
    )  # fmt: skip
    assert list(jsonl_objects(data, "f")) == [(1, {"n": 1}), (4, {"n": 3, "text": text})]
    assert list(jsonl_objects(b"", "f")) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # The column counts characters, as an editor does ("é" is two bytes, one column).
        (b'{"a": 1}\n{"a": "\xc3\xa9\xe9"}\n', "f:2: not UTF-8 text: byte 0xe9 at column 9"),
        (b"\xef\xbb\xbf\xff", "f:1: not UTF-8 text: byte 0xff at column 1"),
        (b'{"a": 1}\n{"a": }\n', "f:2: not JSON: Expecting value at column 7"),
        (b'{"a": 1} x', "f:1: not JSON: Extra data at column 10"),
        (b"\xe2\x80\xa8\n", "f:1: not JSON: Expecting value at column 1"),  # not JSON whitespace
        (b"[" * 100_000, "f:1: not JSON: nested too deeply to read"),
        (b'{"a": 1}\n[1]', "f:2: each line must be a JSON object, not an array"),
        (b'"x"', "f:1: each line must be a JSON object, not a string"),
        (b"3.5", "f:1: each line must be a JSON object, not a number"),
        (b"null", "f:1: each line must be a JSON object, not null"),
    ],
)
def test_a_bad_line_is_named_by_line_column_and_problem(data: bytes, message: str) -> None:
    with pytest.raises(JsonlError) as err:
        list(jsonl_objects(data, "f"))
    assert str(err.value) == message or str(err.value).startswith(message + " ")
    # One error, both kinds: the CLI prints a RolloutError; a ValueError fails a job.
    assert isinstance(err.value, RolloutError) and isinstance(err.value, ValueError)


def test_a_file_is_named_by_its_path_or_where(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": \n')
    with pytest.raises(JsonlError, match=r"^" + str(path) + r":3: not JSON"):
        list(read_jsonl(path))
    with pytest.raises(JsonlError, match=r"^dataset d:3: not JSON"):
        list(read_jsonl(path, "dataset d"))
    with pytest.raises(JsonlError, match=r"missing.jsonl: cannot read: No such file"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_a_staged_dataset_that_is_not_utf8_fails_as_a_value_error_naming_the_line() -> None:
    # The learner turns a ValueError into a failed job; a UnicodeDecodeError said no line.
    with pytest.raises(ValueError, match=r"^source_dataset d:1: not UTF-8 text: byte 0xff"):
        rows_from_jsonl(b"\xff\n", "source_dataset d")
