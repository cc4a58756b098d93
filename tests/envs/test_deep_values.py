"""The helpers that walk state and ground-truth JSON (`values_equal`, `json_copy`,
`interpolate`, `short`) take a value nested 5,000 deep, far past the interpreter's recursion
limit: they answer, never a RecursionError (the depth cut guards tool results only)."""

from __future__ import annotations

import sys
from typing import Any

from rollout.shared.envs.compare import short, values_equal
from rollout.shared.envs.interpolate import interpolate
from rollout.shared.envs.paths import json_copy, resolve_path

DEPTH = 5_000


def nested(depth: int, leaf: Any) -> Any:
    """[{"a": [{"a": ... leaf ...}]}]: `depth` containers deep, built without recursion."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"a": value}
    return value


def bottom(value: Any) -> Any:
    """The leaf of a `nested` value (its containers' only items), walked without recursion."""
    while isinstance(value, dict | list):
        value = value["a"] if isinstance(value, dict) else value[0]
    return value


def test_a_structure_far_deeper_than_the_recursion_limit_is_compared_copied_and_interpolated():
    assert DEPTH > sys.getrecursionlimit()
    deep = nested(DEPTH, 100)
    # Equal by value (100 == 100.0) and as a subset, however deep the difference lies.
    assert values_equal(deep, nested(DEPTH, 100.0))
    assert values_equal(deep, nested(DEPTH, 100), partial=True)
    assert not values_equal(deep, nested(DEPTH, 101))
    assert not values_equal(deep, nested(DEPTH, True))  # bools never equal numbers
    assert not values_equal(deep, nested(DEPTH - 1, 100))
    assert not values_equal(nested(DEPTH, {"x": 1}), nested(DEPTH, {"x": 1, "y": 2}))
    assert values_equal(nested(DEPTH, {"x": 1}), nested(DEPTH, {"x": 1, "y": 2}), partial=True)

    copied = json_copy(deep)
    assert copied is not deep and values_equal(copied, deep) and bottom(copied) == 100
    copied[0] = "changed"
    assert bottom(deep) == 100  # a copy, not a view

    # Every string at any depth is interpolated; a whole placeholder keeps its value's type,
    # and a deep value it names is copied, not shared.
    template = nested(DEPTH, "refund ${args.order}")
    assert bottom(interpolate(template, {"args": {"order": "O-1"}})) == "refund O-1"
    state = {"deep": deep}
    got = interpolate({"found": "${state.deep}"}, {"state": state})
    assert values_equal(got["found"], deep) and got["found"] is not deep
    assert resolve_path(state, "deep[0]") is deep[0]  # the state itself untouched
    try:
        interpolate(nested(DEPTH, "${args.missing}"), {"args": {}})
    except ValueError as exc:
        assert "missing argument 'missing'" in str(exc)
    else:
        raise AssertionError("a missing argument at depth 5,000 was not named")

    # A reason that quotes one: its start, cut, as for any long value.
    said = short(deep)
    assert said.startswith('[{"a":[{"a":') and len(said) <= 120


def test_a_cycle_is_compared_and_copied_without_looping():
    loop: list[Any] = [1]
    loop.append(loop)
    assert values_equal(loop, loop)
    copied = json_copy(loop)
    assert copied[0] == 1 and copied[1] is copied
