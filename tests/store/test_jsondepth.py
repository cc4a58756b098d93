"""JSON values cut at a depth: never a RecursionError, the rest kept as a marked string."""

from __future__ import annotations

import json

from rollout.shared.jsondepth import bounded, compact, loads_bounded


def _nested(levels: int) -> list:
    value: list = ["bottom"]
    for _ in range(levels - 1):
        value = [value]
    return value


def test_a_value_within_the_limit_is_itself_and_one_past_it_is_cut_as_a_marked_string() -> None:
    shallow = {"a": [1, {"b": "x"}], "c": None}
    assert bounded(shallow, 3) is shallow
    cut = bounded(_nested(2_000), 3)
    assert cut[0][0][0].startswith("[cut at depth 3] [[[[")
    assert cut[0][0][0].endswith("…")
    assert json.loads(json.dumps(bounded(_nested(2_000)))) is not None  # it serialises


def test_compact_writes_any_depth_as_json_up_to_its_limit() -> None:
    value = {"a": [1, {"b": 'x"y'}, None], "c": True}
    assert compact(value, 1_000) == json.dumps(value, separators=(",", ":"))
    assert compact(_nested(5_000), 10) == "[" * 10 + "…"


def test_text_nested_past_what_json_loads_reads_is_read_cut() -> None:
    text = '{"r": ' + "[" * 3_000 + '"a]\\"{"' + "]" * 3_000 + ', "z": 1}'
    value = loads_bounded(text, 3)
    assert value["z"] == 1
    assert value["r"][0][0].startswith("[cut at depth 3] [[[")
    assert loads_bounded("[[[1]], 2]", 2) == [["[cut at depth 2] [1]"], 2]
