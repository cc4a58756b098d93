"""Dot paths and `${...}` interpolation: examples plus hypothesis properties."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rollout.shared.envs.interpolate import (
    InterpolationError,
    arg_names,
    interpolate,
    interpolate_string,
)
from rollout.shared.envs.paths import (
    APPEND,
    PathError,
    format_path,
    get_path,
    parse_path,
    resolve_path,
    set_path,
)

STATE = {
    "refunds": [{"order_id": "O-1", "amount": 100}],
    "a": {"b": {"c": 3}},
    "files": {"main.py": "print(1)"},
    "s": "hello",
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("a.b.c", 3),
        ("refunds.length", 1),
        ("refunds[0].amount", 100),
        ("refunds[-1].order_id", "O-1"),
        ("refunds.0.amount", 100),
        ('files["main.py"]', "print(1)"),
        ("files['main.py'].length", 8),
        ("s.length", 5),
        ("a.length", 1),
    ],
)
def test_resolve_examples(path: str, value: object) -> None:
    assert resolve_path(STATE, path) == value


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("refundz", "no key 'refundz'"),
        ("refunds[3]", "index 3 out of range"),
        ("a.b.c.d", "cannot read 'd' from int"),
        ("a..b", "empty segment"),
        ("a.", "ends with '.'"),
        ("a[x]", "bad bracket"),
        ("", "empty path"),
    ],
)
def test_resolve_errors_name_the_spot(path: str, fragment: str) -> None:
    with pytest.raises(PathError, match=fragment.replace("[", r"\[").replace(".", r"\.")):
        resolve_path(STATE, path)


def test_set_path_creates_and_appends() -> None:
    state: dict = {}
    set_path(state, "a.b", 1)
    set_path(state, "items[]", {"x": 1})
    set_path(state, "items[]", {"x": 2})
    set_path(state, "items[0].x", 9)
    assert state == {"a": {"b": 1}, "items": [{"x": 9}, {"x": 2}]}
    with pytest.raises(PathError):
        set_path(state, "a.b[]", 3)  # a.b is an int, not a list
    with pytest.raises(PathError):
        parse_path("a[].b")


def test_interpolation_keeps_type_of_whole_placeholder() -> None:
    ctx = {"args": {"amount": 100, "id": "O-1", "items": [1, 2]}}
    assert interpolate("${args.amount}", ctx) == 100
    assert interpolate("${args.items}", ctx) == [1, 2]
    assert interpolate("${ args.id }", ctx) == "O-1"
    assert interpolate("orders.${args.id}", ctx) == "orders.O-1"
    assert interpolate("n=${args.amount}, l=${args.items}", ctx) == "n=100, l=[1, 2]"
    assert interpolate({"a": ["${args.amount}", "x"]}, ctx) == {"a": [100, "x"]}
    assert interpolate("$${args.id}", ctx) == "${args.id}"
    assert interpolate("${args.items[1]}", ctx) == 2
    assert interpolate("${args.items.length}", ctx) == 2


def test_interpolation_errors() -> None:
    with pytest.raises(InterpolationError, match="missing argument 'nope'"):
        interpolate("${args.nope}", {"args": {}})
    with pytest.raises(InterpolationError, match="unknown root 'env'"):
        interpolate("${env.HOME}", {"args": {}})
    assert arg_names({"v": "${args.a}-${args.b}", "w": ["${args.a}", "${state.x}"]}) == ["a", "b"]


# ------------------------------------------------------------------ properties

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
arg_key = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True).filter(
    lambda s: s != "length"
)


@settings(max_examples=200, deadline=None)
@given(name=arg_key, value=json_values)
def test_whole_placeholder_returns_value_unchanged(name: str, value: object) -> None:
    assert interpolate_string("${args." + name + "}", {"args": {name: value}}) == value


@settings(max_examples=200, deadline=None)
@given(text=st.text().filter(lambda t: "${" not in t))
def test_text_without_placeholders_is_untouched(text: str) -> None:
    assert interpolate(text, {"args": {}}) == text


@settings(max_examples=200, deadline=None)
@given(name=arg_key, value=st.text(), prefix=st.text(max_size=5).filter(lambda t: "$" not in t))
def test_arg_values_are_never_reinterpolated(name: str, value: str, prefix: str) -> None:
    # An argument that itself looks like a placeholder must come through literally.
    ctx = {"args": {name: value, "secret": "S"}}
    out = interpolate_string(prefix + "${args." + name + "}", ctx)
    assert out == prefix + value


@settings(max_examples=200, deadline=None)
@given(name=arg_key, value=json_values)
def test_embedded_placeholder_is_json_text(name: str, value: object) -> None:
    out = interpolate_string("<${args." + name + "}>", {"args": {name: value}})
    inner = out[1:-1]
    assert inner == (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(
        st.text(min_size=1, max_size=6) | st.integers(min_value=0, max_value=5),
        min_size=1,
        max_size=5,
    ),
    leaf=json_values,
)
def test_set_then_resolve_roundtrip(keys: list, leaf: object) -> None:
    # Build a structure containing `leaf` at the path, then resolve the formatted path back.
    if isinstance(keys[0], int):
        keys[0] = str(keys[0])
    root: dict = {}
    node: object = root
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        child = leaf if last else ([] if isinstance(keys[i + 1], int) else {})
        if isinstance(key, int):
            assert isinstance(node, list)
            node.extend([None] * (key + 1 - len(node)))
            node[key] = child
        else:
            assert isinstance(node, dict)
            node[key] = child
        node = child
    path = format_path(keys)
    assert parse_path(path) == keys
    assert resolve_path(root, path) == leaf


@settings(max_examples=300, deadline=None)
@given(path=st.text(max_size=30), data=json_values)
@example(path="²", data=[])  # found by hypothesis: "²".isdigit() is True but int("²") fails
def test_any_path_resolves_or_raises_path_error(path: str, data: object) -> None:
    try:
        segments = parse_path(path)
    except PathError:
        return
    assert segments and APPEND not in segments[:-1]
    sentinel = object()
    try:
        value = resolve_path(data, path)
    except PathError:
        assert get_path(data, path, default=sentinel) is sentinel
    else:
        assert get_path(data, path, default=sentinel) is value
