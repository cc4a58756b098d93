"""The engine's hot-path shortcuts give exactly what the general code gives (issue 12)."""

from __future__ import annotations

import copy
import gc
import itertools
import re

import pytest

from rollout import (
    Environment,
    Task,
    action_tool,
    lookup_tool,
    primitive,
    verifier_config,
    workflow_config,
)
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.envs import build_runtime, score
from rollout.shared.envs.interpolate import InterpolationError, compile_template, interpolate
from rollout.shared.envs.memo import per_object
from rollout.shared.envs.params import argument_checker, argument_errors
from rollout.shared.envs.paths import PathError, resolve_path, set_path
from rollout.shared.envs.templates import typed_config
from rollout.shared.envs.verifiers.registry import REGISTRY, Outcome, PrimitiveDef


class _Text(str):
    """A str subclass: exact-type shortcuts must still accept it as a string."""


SCHEMAS = [
    {"type": "object", "properties": {}, "additionalProperties": True},
    {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "n": {"type": "number"},
            "i": {"type": "integer"},
            "b": {"type": "boolean"},
            "a": {"type": "array"},
            "o": {"type": "object"},
            "u": {"type": ["string", "null"]},
            "opt": {"type": "string?"},
            "free": {"description": "untyped"},
            "bogus": {"type": "nonsense"},
        },
        "required": ["s", "n"],
    },
    {"type": "object", "properties": {"x": {"type": "integer"}}, "required": "x"},
    {"type": "object", "properties": ["not", "a", "dict"], "required": []},
    {"type": "object", "required": ["only"]},
]

VALUES = [None, True, False, 0, 1, 2.0, 2.5, "t", _Text("t"), [], {}, [1], {"k": 1}]


def _argument_sets():
    yield {}
    yield {"only": 1}
    yield {"x": 1}
    for name in ("s", "n", "i", "b", "a", "o", "u", "opt", "free", "bogus", "x", "extra"):
        for value in VALUES:
            yield {"s": "ok", "n": 1, name: value}
    for left, right in itertools.product(VALUES[:7], repeat=2):
        yield {"i": left, "n": right}


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_argument_checker_matches_argument_errors(schema):
    check = argument_checker(schema)
    for args in _argument_sets():
        try:
            want = argument_errors(schema, args)
        except (AttributeError, TypeError) as exc:
            with pytest.raises(type(exc)):
                check(args)
            continue
        assert check(args) == want, args


CONTEXT = {
    "args": {"id": "O-1", "amount": 5, "items": [{"sku": "a"}, {"sku": "b"}], "n": None},
    "state": {"refunds": [{"id": "R-1"}], "flags": {"vip": True}},
    "input": {"user": "u1"},
}

TEMPLATES = [
    "plain text",
    "${args.id}",
    "${ args.amount }",
    "${args.items}",
    "${args.items[1].sku}",
    "${args.items.length}",
    "${state.refunds[-1]}",
    "${state.flags}",
    "${args.n}",
    "${args}",
    "order ${args.id} for ${args.amount}",
    "$${args.id} stays literal",
    "${input.user}",
    {"order_id": "${args.id}", "amount": "${args.amount}", "nested": ["${args.items}", 3, None]},
    ["${args.id}", {"k": "${state.flags.vip}"}],
    ("${args.id}", 1.5),
    7,
    None,
    {"set": {1, 2}},
]

BROKEN = [
    "${args.missing}",
    "${nowhere.x}",
    "${args.items[9]}",
    "${args.id.deeper}",
    "${args..id}",
    "${}",
    "${args[}",
    {"ok": "${args.id}", "bad": "${args.missing}"},
    "text ${args.missing}",
]


@pytest.mark.parametrize("template", TEMPLATES, ids=range(len(TEMPLATES)))
def test_compiled_template_matches_interpolate(template):
    ctx = copy.deepcopy(CONTEXT)
    got = compile_template(template)(ctx)
    assert got == interpolate(template, ctx)
    assert ctx == CONTEXT  # neither changes the context
    # Non-scalar results are copies: changing them leaves args and state alone.
    for leaf in _containers(got):
        leaf.clear()
    assert ctx == CONTEXT


def _containers(value):
    if isinstance(value, dict | list | set):
        yield value
        for child in value.values() if isinstance(value, dict) else value:
            yield from _containers(child)


@pytest.mark.parametrize("template", BROKEN, ids=range(len(BROKEN)))
def test_compiled_template_raises_interpolates_error(template):
    with pytest.raises(InterpolationError) as want:
        interpolate(template, CONTEXT)
    with pytest.raises(InterpolationError) as got:
        compile_template(template)(CONTEXT)
    assert str(got.value) == str(want.value)


def test_paths_keep_their_messages_and_length():
    state = {"a": [1, 2], "d": {"length": 9}, "e": {}}
    assert resolve_path(state, "a.length") == 2
    assert resolve_path(state, "d.length") == 9
    assert resolve_path(state, "e.length") == 0
    cases = {
        "a.b": "a: list has no key 'b'",
        "a[5]": "a: index 5 out of range (length 2)",
        "e.x": "e: no key 'x'",
        "zz": "<root>: no key 'zz'",
    }
    for path, message in cases.items():
        with pytest.raises(PathError, match="^" + re.escape(message) + "$"):
            resolve_path(state, path)
    with pytest.raises(PathError, match=r"^e: cannot append to dict$"):
        set_path(state, "e[]", 1)
    with pytest.raises(PathError, match=r"^a: index 7 out of range \(length 2\)$"):
        set_path(state, "a[7]", 1)


class _Spec:
    """A weak-referenceable stand-in for a spec object."""


def _count_build(obj):
    _count_build.calls += 1
    return [_count_build.calls]


def test_per_object_builds_once_per_live_object():
    _count_build.calls = 0
    a, b = _Spec(), _Spec()
    assert per_object(a, _count_build) is per_object(a, _count_build)
    assert per_object(b, _count_build) == [2]
    assert _count_build.calls == 2
    from rollout.shared.envs import memo

    key = id(a)
    del a
    gc.collect()
    assert key not in memo._CACHE  # the entry goes with its object
    per_object({"not": "weak-referenceable"}, _count_build)
    per_object({"not": "weak-referenceable"}, _count_build)
    assert _count_build.calls == 4


def _env() -> Environment:
    return Environment(
        slug="fast",
        template="workflow",
        config=workflow_config(
            tools=[
                lookup_tool("get_order", from_array="orders", match_field="id"),
                action_tool(
                    "refund",
                    state_array="refunds",
                    value={"order_id": "${args.order_id}", "amount": "${args.amount}"},
                    params_schema={"order_id": "string", "amount": "number"},
                ),
            ],
            fixtures={"orders": [{"id": "O-1", "amount": 5}]},
            initial_mutable_state={"refunds": []},
        ),
        tasks=[Task(instruction="x", hidden_ground_truth={"refunds.length": 1})],
        verifier=verifier_config(
            primitive("called", "tool_was_called", tool="get_order"),
            primitive("count", "state_match", expected={"refunds.length": 1}, weight=2),
            primitive("no_errors", "no_tool_errors"),
        ),
    )


async def test_runtime_still_checks_arguments_and_copies_fixtures():
    spec = _env().to_spec()
    for _ in range(2):  # the second runtime uses the templates compiled for the first
        rt = build_runtime(spec, 0)
        bad = await rt.call_tool("refund", {"order_id": 1, "amount": True})
        assert bad.error == (
            "refund: argument 'order_id' must be string, got number; "
            "argument 'amount' must be number, got boolean"
        )
        missing = await rt.call_tool("refund", {"amount": 1})
        assert missing.error == "refund: missing required argument 'order_id'"
        got = await rt.call_tool("get_order", {"id": "O-1"})
        got.output["amount"] = 10**6  # the model's copy, not the fixture
        again = await rt.call_tool("get_order", {"id": "O-1"})
        assert again.output == {"id": "O-1", "amount": 5}
        done = await rt.call_tool("refund", {"order_id": "O-1", "amount": 5})
        assert done.ok and rt.final_state() == {"refunds": [{"order_id": "O-1", "amount": 5}]}


def _trajectory(refunds: int, error: str | None = None) -> Trajectory:
    return Trajectory(
        tool_calls=[
            ToolCallRecord(index=0, name="get_order", arguments={"id": "O-1"}, error=error)
        ],
        final_state={"refunds": [{"order_id": "O-1", "amount": 5}] * refunds},
    )


async def test_scores_follow_each_trajectory_not_the_cache():
    spec = _env().to_spec()
    task = spec.tasks[0]
    good = await score(spec, task, _trajectory(1))
    assert good.passed and good.score == 1.0
    bad = await score(spec, task, _trajectory(2, error="boom"))
    assert not bad.passed
    # Its one call errored: it does not count as a call (and is a tool error).
    assert [(p.name, p.passed) for p in bad.primitives] == [
        ("called", False),
        ("count", False),
        ("no_errors", False),
    ]
    assert bad.score == 0.0
    half = await score(spec, task, _trajectory(2))
    assert [p.passed for p in half.primitives] == [True, False, True]
    assert half.score == pytest.approx(2 / 4)
    assert (await score(spec, task, _trajectory(1))) == good


async def test_a_primitive_type_registered_later_is_used():
    env = _env()
    raw = env.to_spec().to_json_dict()
    raw["verifier"] = {"primitives": [{"name": "late", "type": "late_type_for_test"}]}
    from rollout.shared.contracts.envspec import EnvironmentSpec
    from rollout.shared.envs.verifiers.primitives.state_match import StateMatchParams

    spec = EnvironmentSpec.model_validate(raw)
    task = spec.tasks[0]
    first = await score(spec, task, _trajectory(1))
    assert not first.passed and "unknown primitive type" in first.primitives[0].reason
    REGISTRY["late_type_for_test"] = PrimitiveDef(
        "late_type_for_test", StateMatchParams, lambda p, ctx: Outcome(1.0, True, "late")
    )
    try:
        second = await score(spec, task, _trajectory(1))
    finally:
        del REGISTRY["late_type_for_test"]
    assert second.passed and second.primitives[0].reason == "late"
    third = await score(spec, task, _trajectory(1))
    assert "unknown primitive type" in third.primitives[0].reason


def test_json_copy_is_a_deep_copy():
    from rollout.shared.envs.paths import json_copy

    shared = {"k": [1, {"x": "y"}]}
    value = {"a": shared, "b": [shared, 2.5, None, True], "t": (1, [2]), "s": {3}}
    got = json_copy(value)
    assert got == copy.deepcopy(value)
    got["a"]["k"][1]["x"] = "changed"
    got["t"][1].append(9)
    assert value == {"a": shared, "b": [shared, 2.5, None, True], "t": (1, [2]), "s": {3}}
    cyclic: list = [1]
    cyclic.append(cyclic)
    again = json_copy(cyclic)  # falls back to deepcopy
    assert again[1] is again and again is not cyclic


async def test_scores_are_clamped_as_before():
    from rollout.shared.contracts.envspec import EnvironmentSpec
    from rollout.shared.envs.verifiers.primitives.state_match import StateMatchParams

    raw = _env().to_spec().to_json_dict()
    raw["verifier"] = {"primitives": [{"name": "odd", "type": "odd_scores_for_test"}]}
    spec = EnvironmentSpec.model_validate(raw)
    seen = {}
    for value in (float("nan"), -0.0, -3.0, 0.0, 0.25, 1.0, 7.0, 2):
        REGISTRY["odd_scores_for_test"] = PrimitiveDef(
            "odd_scores_for_test",
            StateMatchParams,
            lambda p, ctx, value=value: Outcome(value, True, "x"),
        )
        try:
            seen[str(value)] = repr((await score(spec, spec.tasks[0], _trajectory(1))).score)
        finally:
            del REGISTRY["odd_scores_for_test"]
    assert seen == {
        "nan": "0.0",
        "-0.0": "0.0",
        "-3.0": "0.0",
        "0.0": "0.0",
        "0.25": "0.25",
        "1.0": "1.0",
        "7.0": "1.0",
        "2": "1.0",
    }


def test_per_object_entries_drop_quietly_at_interpreter_exit(monkeypatch):
    # At exit, module globals may be None before the last specs are collected: dropping their
    # entries must not print "Exception ignored" tracebacks into every run's output.
    import sys

    from rollout.shared.envs import memo

    cache = memo._CACHE
    obj = _Spec()
    per_object(obj, _count_build)
    hits = []
    monkeypatch.setattr(sys, "unraisablehook", hits.append)
    monkeypatch.setattr(memo, "_CACHE", None)
    key = id(obj)
    del obj
    gc.collect()
    assert hits == [] and key not in cache


async def test_episodes_of_one_batch_share_no_state_and_final_state_is_a_copy():
    from rollout.shared.envs.engine import start_runtimes

    spec = _env().to_spec()
    first, second = await start_runtimes(spec, [0, 0])  # one work item, the same task twice
    assert (await first.call_tool("refund", {"order_id": "O-1", "amount": 5})).ok
    assert second.final_state() == {"refunds": []}  # nothing leaked from its sibling
    done = first.final_state()
    assert done == {"refunds": [{"order_id": "O-1", "amount": 5}]}
    done["refunds"][0]["amount"] = 999  # the verifier's copy, not the runtime's state
    done["refunds"].append("extra")
    assert first.final_state() == {"refunds": [{"order_id": "O-1", "amount": 5}]}
    # Later calls do not reach into a state already handed out either.
    assert (await first.call_tool("refund", {"order_id": "O-1", "amount": 1})).ok
    assert len(done["refunds"]) == 2 and len(first.final_state()["refunds"]) == 2
    # The spec's initial state and fixtures are untouched.
    config = typed_config(spec)
    assert config.initial_mutable_state == {"refunds": []}
    assert config.fixtures == {"orders": [{"id": "O-1", "amount": 5}]}
    fresh = build_runtime(spec, 0)
    assert fresh.final_state() == {"refunds": []}
    for rt in (first, second, fresh):
        await rt.close()
