"""Plan-time validation: each problem names its path; fuzzed specs never raise tracebacks."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout import (
    Environment,
    RolloutError,
    Task,
    action_tool,
    lookup_tool,
    primitive,
    verifier_config,
    workflow_config,
)
from rollout.shared.envs import build_runtime, validate_environment


def refund_env(**overrides: Any) -> Environment:
    config = workflow_config(
        tools=[
            lookup_tool("get_order", from_array="orders", match_field="id"),
            action_tool("refund", state_array="refunds"),
        ],
        fixtures={"orders": [{"id": "O-1", "amount": 100}]},
        initial_mutable_state={"refunds": []},
    )
    args: dict[str, Any] = {
        "slug": "refund-agent",
        "template": "workflow",
        "config": config,
        "tasks": [Task(instruction="Refund O-1", hidden_ground_truth={"refunds.length": 1})],
    }
    args.update(overrides)
    return Environment(**args)


def test_valid_env_has_no_problems() -> None:
    assert validate_environment(refund_env()) == []


def test_issue_example_fixture_typo() -> None:
    env = refund_env()
    env.config["tools"][0]["fromArray"] = "orderz"
    env.config["tools"].insert(0, {"name": "ping", "kind": "mock"})
    problems = validate_environment(env)
    assert any(p.startswith("config.tools[1].fromArray: no fixture 'orderz'") for p in problems)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda e: setattr(e, "slug", "Bad Slug!"), "slug: String should match pattern"),
        (lambda e: setattr(e, "template", "worflow"), "template: unknown template 'worflow'"),
        (lambda e: setattr(e, "tasks", []), "tasks: no tasks (add at least one Task)"),
        (
            lambda e: e.config["tools"][0].update(fromArray=None, fixturePath=None),
            "config.tools[0]: a lookup tool needs fixturePath or fromArray",
        ),
        (
            lambda e: e.config["tools"][1].update(kind="acton"),
            "config.tools[1].kind: Input should be 'lookup', 'action' or 'mock'",
        ),
        (
            lambda e: e.config["tools"][1].update(stateArrray="x"),
            "config.tools[1].stateArrray: unknown key (check the spelling)",
        ),
        (
            lambda e: e.config["tools"][0].update(matchField="idd"),
            "config.tools[0].matchField: no orders entry has field 'idd'",
        ),
        (
            lambda e: e.config["tools"].append({"name": "refund", "kind": "mock"}),
            "config.tools[2].name: duplicate tool 'refund'",
        ),
        (
            lambda e: e.config["tools"][0].update(paramsSchema={"id": "strng"}),
            "config.tools[0].paramsSchema.id: unknown type 'strng'",
        ),
        (
            lambda e: e.config["tools"][1].update(
                value={"amount": "${args.amt}"}, paramsSchema={"amount": "number"}
            ),
            "config.tools[1].value: ${args.amt} uses argument 'amt', which paramsSchema does not declare",
        ),
        (
            lambda e: e.config["tools"][1].update(value="${secrets.key}"),
            "config.tools[1].value: placeholder ${secrets.key} must start with one of args, state, input",
        ),
        (
            lambda e: e.config.update(initialMutableState={"refunds": {}}),
            "config.tools[1].stateArray: initialMutableState.refunds is dict, not an array",
        ),
        (
            lambda e: setattr(
                e, "tasks", [Task(instruction="x", hidden_ground_truth={"refundz": []})]
            ),
            "tasks[0].hiddenGroundTruth.refundz: not in the environment's state (state keys: refunds; "
            "did you mean 'refunds'?)",
        ),
        (
            lambda e: setattr(e, "tasks", [Task(instruction="x")]),
            "tasks[0].hiddenGroundTruth: missing; the default verifier (state_match) compares against it",
        ),
        (
            lambda e: setattr(e, "tasks", [Task(instruction="  ", hidden_ground_truth={})]),
            "tasks[0].instruction: empty",
        ),
        (
            lambda e: setattr(e, "tasks", [{"instruction": "x", "hiddenGroundTruht": {}}]),
            "tasks[0].hiddenGroundTruht: unknown key (check the spelling)",
        ),
        (
            lambda e: setattr(e, "verifier", verifier_config(primitive("p", "state_mtch"))),
            "verifier.primitives[0].type: unknown primitive 'state_mtch' (known: ",
        ),
        (
            lambda e: setattr(
                e, "verifier", verifier_config(primitive("p", "tool_was_called", tool="get_ordr"))
            ),
            "verifier.primitives[0].tool: unknown tool 'get_ordr' (tools: get_order, refund)",
        ),
        (
            lambda e: setattr(
                e,
                "verifier",
                verifier_config(primitive("p", "tool_call_order", tools=["get_order", "refnd"])),
            ),
            "verifier.primitives[0].tools: unknown tool 'refnd'",
        ),
        (
            lambda e: setattr(e, "verifier", verifier_config(primitive("p", "tool_was_called"))),
            "verifier.primitives[0].tool: Field required",
        ),
        (
            lambda e: setattr(
                e, "verifier", verifier_config(primitive("p", "url_reached", url="x"))
            ),
            "verifier.primitives[0].type: url_reached works with the browser template, not workflow",
        ),
        (
            lambda e: setattr(
                e,
                "verifier",
                verifier_config(primitive("p", "no_tool_errors"), primitive("p", "no_tool_errors")),
            ),
            "verifier.primitives[1].name: duplicate primitive name 'p'",
        ),
        (
            lambda e: setattr(
                e, "verifier", verifier_config(primitive("p", "no_tool_errors", weight=-1))
            ),
            "verifier.primitives[0].weight: Input should be greater than or equal to 0",
        ),
        (lambda e: setattr(e, "verifier", {"primitives": []}), "verifier.primitives: empty"),
        (lambda e: setattr(e, "config", "nope"), "config: Input should be a valid dictionary"),
    ],
)
def test_problems_name_their_path(mutate: Any, expected: str) -> None:
    env = refund_env()
    mutate(env)
    problems = validate_environment(env)
    assert any(p.startswith(expected) for p in problems), problems


def test_every_problem_listed_at_once() -> None:
    env = refund_env()
    env.config["tools"][0]["fromArray"] = "orderz"
    env.verifier = verifier_config(primitive("p", "nope"))
    env.tasks = [Task(instruction="")]
    problems = validate_environment(env)
    assert len(problems) >= 3


def test_sql_problems() -> None:
    env = Environment(
        slug="db",
        template="sql",
        schema="CREATE TABLE t (id INTEGER);",
        seed="INSERT INTO u VALUES (1);",
        tasks=[Task(instruction="q", hidden_ground_truth={"query": "SELECT nope FROM t"})],
    )
    problems = validate_environment(env)
    assert "config.seed: no such table: u" in problems
    assert "tasks[0].hiddenGroundTruth.query: sql error: no such column: nope" in problems
    env.config["schema"] = "CREAT TABLE"
    assert any(p.startswith('config.schema: near "CREAT"') for p in validate_environment(env))
    with pytest.raises(RolloutError, match="cannot start the sql runtime"):
        build_runtime(env, 0)


def test_misspelt_ground_truth_keys_are_named_with_the_key_meant() -> None:
    # Each typo was silently ignored: a code-editing task's hidden tests never ran (the
    # rollout passed on its files alone), and a sql task could never pass.
    fixed = {"calc.py": "def add(a, b):\n    return a + b\n"}
    tests = {"test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"}
    code = Environment(
        slug="ce",
        template="code-editing",
        config={"files": {"calc.py": "def add(a, b):\n    return a - b\n"}},
        tasks=[
            Task(instruction="fix", hidden_ground_truth={"files": fixed, "tsts": tests}),
            Task(instruction="fix", hidden_ground_truth={"tsts": tests}),
            Task(instruction="fix", hidden_ground_truth={"files": fixed, "tests": tests}),
        ],
    )
    assert validate_environment(code) == [
        "tasks[0].hiddenGroundTruth.tsts: not read by the code-editing template's default "
        "verifier (it reads: files, testCommand, tests; did you mean 'tests'?)",
        "tasks[1].hiddenGroundTruth.tsts: not in the environment's state (state keys: files, "
        "testRuns; did you mean 'tests'?)",
    ]
    sql = Environment(
        slug="db",
        template="sql",
        schema="CREATE TABLE t (id INTEGER);",
        tasks=[
            Task(instruction="q", hidden_ground_truth={"qury": "SELECT count(*) FROM t"}),
            Task(instruction="q", hidden_ground_truth={"query": "SELECT 1", "ordred": True}),
            Task(instruction="q", hidden_ground_truth={"rows": [[0]]}),
            Task(instruction="q", hidden_ground_truth={"rowCounts": {"t": 0}}),
        ],
    )
    assert validate_environment(sql) == [
        "tasks[0].hiddenGroundTruth.qury: not in the environment's state (state keys: "
        "rowCounts, submission, tables; did you mean 'query'?)",
        "tasks[1].hiddenGroundTruth.ordred: not read by the sql template's default verifier "
        "(it reads: orderMatters, query, rows)",
    ]
    # A verifier of the author's own reads the ground truth its own way: no key is judged.
    sql.verifier = verifier_config(primitive("r", "sql_result_match", query="SELECT 1"))
    assert validate_environment(sql) == []


def test_browser_problems() -> None:
    env = Environment(
        slug="site",
        template="browser",
        config={
            "pages": [
                {
                    "url": "/a",
                    "elements": [
                        {"id": "l", "type": "link", "href": "/missing"},
                        {"id": "l", "type": "button", "form": "nof"},
                        {"id": "i", "type": "inpt"},
                    ],
                },
                {"url": "/a"},
            ],
            "initialUrl": "/zzz",
        },
        tasks=[Task(instruction="x", hidden_ground_truth={"urll": "/a"})],
    )
    problems = validate_environment(env)
    assert (
        "config.pages[0].elements[2].type: Input should be 'text', 'link', 'input', 'button' or 'form'"
        in problems
    )
    env.config["pages"][0]["elements"].pop()
    problems = validate_environment(env)
    for expected in (
        "config.pages[1].url: duplicate page '/a'",
        "config.initialUrl: no page '/zzz'",
        "config.pages[0].elements[0].href: no page '/missing'",
        "config.pages[0].elements[1].id: duplicate element id 'l'",
        "config.pages[0].elements[1].form: no form 'nof' on /a",
    ):
        assert expected in problems, problems
    assert any(
        p.startswith("tasks[0].hiddenGroundTruth.urll: not in the environment's state")
        for p in problems
    )


def test_non_environment_input() -> None:
    assert validate_environment(42)[0].startswith("expected an Environment")
    assert validate_environment({"slug": "x"}) == [
        "template: Field required",
        "tasks: no tasks (add at least one Task)",
    ]


# ------------------------------------------------------------------ fuzzing

json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_any = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _replace(root: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    node = root
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return root


def _example_raws() -> list[dict[str, Any]]:
    from pathlib import Path

    from rollout.shared.envs import load_environments

    root = Path(__file__).resolve().parents[2] / "examples"
    raws = []
    for f in sorted(root.glob("*.py")):
        for env in load_environments(f):
            raw = env.to_raw()
            raw["tasks"] = raw["tasks"][:2]
            raws.append(raw)
    return raws


EXAMPLES = _example_raws()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_specs_give_problems_never_tracebacks(data: st.DataObject) -> None:
    raw = copy.deepcopy(data.draw(st.sampled_from(EXAMPLES)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(raw)
        path = data.draw(st.sampled_from(paths))
        raw = _replace(raw, path, data.draw(json_any))
    problems = validate_environment(raw)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    assert not any("could not be checked" in p for p in problems), problems
    # Building a runtime either works or raises a RolloutError: never anything else.
    try:
        rt = build_runtime(raw, 0)
    except RolloutError:
        return
    assert isinstance(rt.tool_specs(), list)


@settings(max_examples=200, deadline=None)
@given(
    template=st.sampled_from(["workflow", "custom", "sql", "browser", "code-editing", "plugin"]),
    config=json_any,
    verifier=json_any,
    tasks=json_any,
)
def test_random_configs_per_template(template: str, config: Any, verifier: Any, tasks: Any) -> None:
    raw = {
        "slug": "f",
        "template": template,
        "config": config,
        "tasks": tasks,
        "verifier": verifier,
    }
    problems = validate_environment(raw)
    assert problems and all(isinstance(p, str) for p in problems)
    assert not any("could not be checked" in p for p in problems), problems


def test_values_json_cannot_carry_are_named_by_path() -> None:
    # A NaN in a ground truth would be stored as null (the task then unpassable), a lone
    # surrogate is not UTF-8 (no service could read the spec), an infinite weight has no mean.
    nan_truth = refund_env(
        tasks=[
            Task(
                instruction="Refund O-1",
                hidden_ground_truth={"refunds": [{"amount": float("nan")}]},
            )
        ]
    )
    assert validate_environment(nan_truth) == [
        "tasks[0].hiddenGroundTruth.refunds[0].amount: nan is not a finite number "
        "(JSON has no NaN or inf)"
    ]
    surrogate = refund_env(tasks=[Task(instruction="Refund \ud800 O-1")])
    assert any(
        p.startswith("tasks[0].instruction: contains '\\ud800' at position 7, which is not UTF-8")
        for p in validate_environment(surrogate)
    ), validate_environment(surrogate)
    heavy = refund_env(verifier=verifier_config(primitive("s", "state_match", weight=float("inf"))))
    assert "verifier.primitives[0].weight: Input should be a finite number" in (
        validate_environment(heavy)
    )


def test_a_placeholder_never_closed_is_named() -> None:
    env = refund_env()
    env.config["tools"][1]["value"] = {"order_id": "${args.order_id", "note": "$${literal}"}
    assert validate_environment(env) == [
        "config.tools[1].value: placeholder '${args.order_id' is never closed (a `}` is missing)"
    ]
