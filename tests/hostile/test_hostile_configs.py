"""Hostile environment configs and tool-call arguments (hypothesis): problems, never tracebacks.

Configs go to `validate_environment`, the validator behind `rollout plan`, `rollout push` and
the registry's push handler; tool-call arguments go to every example template's runtime tools
as a model would send them. 8,100 configs and 5,000 tool calls, derandomized so a failure
reproduces; `tool_failed` (one of our tools crashing with an unexpected exception) counts as a
failure.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout.errors import RolloutError
from rollout.shared.envs import load_environments
from rollout.shared.envs.coerce import raw_environment
from rollout.shared.envs.engine import build_runtime
from rollout.shared.envs.runtime import ToolResult
from rollout.shared.envs.validation import validate_environment

ROOT = Path(__file__).resolve().parents[2]
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TEMPLATES = ["workflow", "custom", "sql", "browser", "code-editing", "plugin", "no-such"]

# Strings a hostile author or model would try: NUL bytes, traversal, injections, placeholders.
nasty_text = st.sampled_from(
    [
        "",
        "\x00",
        "a\x00b",
        "../../etc/passwd",
        "/etc/shadow",
        "${args.x}",
        "${state.__class__}",
        "${",
        "'; DROP TABLE t; --",
        "ATTACH DATABASE '/tmp/x' AS y",
        "\u202e",
        "x" * 5000,
        "__import__('os').system('id')",
        "{{7*7}}",
        "http://169.254.169.254/latest/meta-data",
        "NaN",
        "-1",
    ]
) | st.text(max_size=12)
json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | nasty_text
)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(nasty_text, inner, max_size=4),
    max_leaves=8,
)


def _examples() -> list[dict[str, Any]]:
    raws = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        for env in load_environments(path):
            raw = raw_environment(env)  # as pushed: a plugin carries its own sources
            raw["tasks"] = raw["tasks"][:2]
            raws.append(raw)
    return raws


EXAMPLES = _examples()


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            out.extend(_paths(inner, (*prefix, key)))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            out.extend(_paths(inner, (*prefix, i)))
    return out


def _replace(root: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    node = root
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return root


def _check_problems(problems: Any) -> None:
    assert isinstance(problems, list) and all(isinstance(p, str) and p for p in problems)
    # "could not be checked" is the validator's own guard catching a crash in a check.
    assert not any("could not be checked" in p for p in problems), problems
    assert not any("Traceback" in p for p in problems), problems


@pytest.fixture
def log_events() -> Iterator[list[dict[str, Any]]]:
    """Every structlog event during the test (a crash would log with exc_info)."""
    with structlog.testing.capture_logs() as events:
        yield events


def _no_tracebacks(events: list[dict[str, Any]]) -> None:
    # A plugin's own code raising is reported to the model as the plugin's error (user code);
    # any template of ours raising something unexpected is a crash.
    bad = [
        e
        for e in events
        if e.get("exc_info") or (e.get("event") == "tool_failed" and e.get("template") != "plugin")
    ]
    assert not bad, bad[:3]


# Hypothesis draws a pool of hostile values and a seed; each example then builds several
# configs from them (drawing is the slow part, validation takes about a millisecond), so the
# suite covers thousands of configs in seconds. COUNTS records how many were checked.
COUNTS = {"configs": 0, "tool_calls": 0}
PER_EXAMPLE = 20


@settings(FUZZ, max_examples=300)
@given(seed=st.integers(0, 2**32), pool=st.lists(json_any, min_size=4, max_size=4))
def test_mutated_example_specs_give_named_problems(seed: int, pool: list[Any]) -> None:
    rng = random.Random(seed)
    for _ in range(PER_EXAMPLE):
        raw = copy.deepcopy(rng.choice(EXAMPLES))
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(_paths(raw))
            raw = _replace(raw, path, copy.deepcopy(rng.choice(pool)))
        _check_problems(validate_environment(raw))
        COUNTS["configs"] += 1


@settings(FUZZ, max_examples=300)
@given(
    slug=nasty_text,
    pool=st.lists(json_any, min_size=3, max_size=3),
    extra=st.dictionaries(nasty_text, json_any, max_size=2),
)
def test_random_specs_per_template_are_refused_with_reasons(
    slug: Any, pool: list[Any], extra: dict
) -> None:
    for i, template in enumerate(TEMPLATES):
        config, verifier, tasks = (pool[(i + k) % 3] for k in range(3))
        raw = {
            **extra,
            "slug": slug,
            "template": template,
            "config": config,
            "tasks": tasks,
            "verifier": verifier,
        }
        problems = validate_environment(raw)
        _check_problems(problems)
        assert problems, "a random spec was accepted"
        COUNTS["configs"] += 1


def test_hostile_top_levels() -> None:
    for value in (None, 1, "x", [], [1], b"\x00", {"slug": "\x00"}, {"template": {}}):
        problems = validate_environment(value)
        _check_problems(problems)
        assert problems


# ------------------------------------------------------------------ tool-call arguments

LOOP = asyncio.new_event_loop()
# One runtime per example, reused across examples (their state drifting is part of the fun);
# code-editing's run_tests runs the sandbox and is covered by the sandbox tests.
RUNTIMES = {raw["slug"]: build_runtime(raw, 0) for raw in EXAMPLES}
TOOLS = [
    (slug, spec.name)
    for slug, runtime in RUNTIMES.items()
    for spec in runtime.tool_specs()
    if spec.name != "run_tests"
]


def _arguments_for(runtime: Any, tool: str) -> st.SearchStrategy[Any]:
    """Arguments keyed by the tool's own parameter names (so handlers get past the schema),
    or anything at all (not an object, unknown keys)."""
    spec = next(s for s in runtime.tool_specs() if s.name == tool)
    names = list((spec.parameters or {}).get("properties", {})) or ["x"]
    keyed = st.fixed_dictionaries({}, optional={n: json_any for n in names})
    return keyed | st.dictionaries(nasty_text, json_any, max_size=3) | json_any


@settings(FUZZ, max_examples=250)
@given(data=st.data())
def test_tool_arguments_never_crash_a_tool(data: st.DataObject) -> None:
    calls = []
    for slug, tool in data.draw(st.lists(st.sampled_from(TOOLS), min_size=10, max_size=10)):
        calls.append((slug, tool, data.draw(_arguments_for(RUNTIMES[slug], tool))))
    # Each call's arguments also go to every other tool (the model mixing up its tools).
    calls += [(s, t, calls[(i + 1) % len(calls)][2]) for i, (s, t, _) in enumerate(calls)]
    for slug, tool, arguments in calls:
        with structlog.testing.capture_logs() as log_events:
            result = LOOP.run_until_complete(RUNTIMES[slug].call_tool(tool, arguments))
        assert isinstance(result, ToolResult)
        if result.error is not None:
            assert result.error.strip(), "an empty error names nothing"
        else:
            json.dumps(result.output, default=str)
        _no_tracebacks(log_events)
        COUNTS["tool_calls"] += 1


def test_unknown_tools_and_non_object_arguments_are_named(log_events) -> None:
    for runtime in RUNTIMES.values():
        result = LOOP.run_until_complete(runtime.call_tool("no_such_tool\x00", {}))
        assert "unknown tool" in (result.error or "")
        name = runtime.tool_specs()[0].name
        result = LOOP.run_until_complete(runtime.call_tool(name, ["not", "an", "object"]))
        assert "must be a JSON object" in (result.error or "")
    _no_tracebacks(log_events)


def test_the_suite_checked_at_least_ten_thousand_inputs() -> None:
    """Runs after the fuzzers above (file order): the counts they recorded."""
    if COUNTS["configs"] == 0:
        pytest.skip("run with the fuzz tests (it counts what they checked)")
    assert COUNTS["configs"] >= 8000 and COUNTS["tool_calls"] >= 5000, COUNTS
    assert COUNTS["configs"] + COUNTS["tool_calls"] >= 10_000


def test_every_example_spec_is_still_valid() -> None:
    for raw in EXAMPLES:
        assert validate_environment(raw) == [], raw["slug"]
    with pytest.raises(RolloutError):
        build_runtime({"slug": "x", "template": "workflow", "config": 1, "tasks": []}, 0)
