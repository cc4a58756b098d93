"""The template registry is the single source: one module per template, one registry line.

A toy template defined only in this file (config model, runtime, checks, default verifier and
plan) is registered with one line and then validated, run by `rollout test`'s loop, scored and
demonstrated by the scripted player, without any other module knowing its name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.contracts.export import json_schemas
from rollout.shared.envs import build_runtime, default_verifier, validate_environment
from rollout.shared.envs.coerce import as_spec
from rollout.shared.envs.templates import (
    REGISTRY,
    Template,
    canonical_name,
    get_template,
    template_names,
    typed_config,
)
from rollout.shared.envs.templates.base import BaseRuntime, ToolError
from rollout.shared.envs.templates.protocol import Plan

SHARED = Path(__file__).resolve().parents[2] / "shared"

# ------------------------------------------------------------------ every registered template


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_template_provides_the_protocol(name: str) -> None:
    template = REGISTRY[name]
    assert isinstance(template, Template)
    assert template.name == name  # the registry key is the template's own name
    assert issubclass(template.config_model, CamelModel)
    assert callable(template.runtime)
    assert isinstance(template.aliases, tuple) and isinstance(template.fixed_tools, tuple)
    for hook in (
        "complete_config",
        "tool_names",
        "check_config",
        "plan_tools",
        "state_roots",
        "check_task",
        "default_primitives",
        "start_group",
        "plan",
    ):
        assert callable(getattr(template, hook)), f"{name} lacks {hook}"
    task = TaskSpec(instruction="x")
    prims = template.default_primitives(task)
    assert prims and all(isinstance(p, dict) and p.get("type") for p in prims)


def test_old_names_are_views_of_the_registry() -> None:
    from rollout.shared.envs.templates import FIXED_TOOLS, RUNTIMES, static_tool_names

    assert template_names() == tuple(REGISTRY)
    assert {alias: t.name for t in REGISTRY.values() for alias in t.aliases} == {
        "code_editing": "code-editing",
        "codeediting": "code-editing",
        "nemo-gym": "nemo_gym",
    }
    # The contract names its template; the spelling users type is made canonical on the way in.
    spec = as_spec({"slug": "x", "template": "Code_Editing", "config": {"testCommand": "pytest"}})
    assert spec.template == "code-editing"
    assert RUNTIMES == {n: t.runtime for n, t in REGISTRY.items()}
    assert FIXED_TOOLS["sql"] == ["describe_schema", "run_sql", "submit_answer"]
    code = REGISTRY["code-editing"].config_model.model_validate({"testCommand": "pytest"})
    assert static_tool_names("code-editing", code)[-1] == "run_tests"
    assert static_tool_names("no-such", code) is None
    assert canonical_name("Code_Editing") == "code-editing"
    assert get_template("nemo-gym") is REGISTRY["nemo_gym"]


# Modules that once held per-template knowledge: none may name a template any more.
NEUTRAL_MODULES = [
    "contracts/envspec.py",
    "envs/validation.py",
    "envs/coerce.py",
    "envs/engine.py",
    "envs/templates/__init__.py",
    "envs/verifiers/engine.py",
    "envs/sandbox_check.py",
    "envs/sandbox_required.py",
    "learning/scripted.py",
]


@pytest.mark.parametrize("module", NEUTRAL_MODULES)
def test_no_template_branches_outside_the_template_modules(module: str) -> None:
    names = set(REGISTRY) | {a for t in REGISTRY.values() for a in t.aliases}
    tree = ast.parse((SHARED / module).read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lower() in names
        and id(node) not in docstrings
    ]
    # The registry's keys are its one line per template, and nothing else there names one.
    if module == "envs/templates/__init__.py":
        assert sorted(v.split(": ")[1].strip("'") for v in found) == sorted(REGISTRY)
    else:
        assert found == [], f"{module} branches on a template name"


# ------------------------------------------------------------------ a new template, one module


class ToyConfig(CamelModel):
    """Config of the toy template: how far the counter may go."""

    limit: int = Field(default=10, ge=1)
    start: int = 0


class ToyRuntime(BaseRuntime):
    """One toy episode: a counter the model bumps."""

    template = "toy"

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: ToyConfig) -> None:
        super().__init__(spec, task)
        self.count = config.start
        self.limit = config.limit
        self.add_tool(
            "bump", "Add one to the counter.", {"type": "object", "properties": {}}, self._bump
        )

    def _bump(self, args: dict[str, Any]) -> dict[str, int]:
        if self.count >= self.limit:
            raise ToolError(f"the counter is at its limit ({self.limit})")
        self.count += 1
        return {"count": self.count}

    def final_state(self) -> dict[str, Any]:
        """The counter."""
        return {"count": self.count}


class ToyTemplate(Template):
    """A template that lives in one module (this test) and one registry line."""

    name = "toy"
    aliases = ("toy-counter",)
    config_model = ToyConfig
    runtime = ToyRuntime
    fixed_tools = ("bump",)

    def check_config(self, config: ToyConfig, out: list[str]) -> None:
        """The start must be under the limit."""
        if config.start >= config.limit:
            out.append(f"config.start: {config.start} is not below config.limit ({config.limit})")

    def state_roots(self, config: ToyConfig | None) -> set[str]:
        """Only the counter."""
        return {"count"}

    def check_task(self, config: ToyConfig, task: TaskSpec, where: str, out: list[str]) -> None:
        """The expected count must be reachable."""
        gt = task.hidden_ground_truth
        if isinstance(gt, dict) and isinstance(gt.get("count"), int) and gt["count"] > config.limit:
            out.append(f"{where}.hiddenGroundTruth.count: above config.limit ({config.limit})")

    def plan(self, spec: EnvironmentSpec, task: TaskSpec, runtime: Any) -> Plan | None:
        """Bump until the expected count."""
        gt = task.hidden_ground_truth
        start = typed_config(spec).start
        return [("bump", {})] * (gt["count"] - start) if isinstance(gt, dict) else None


@pytest.fixture
def toy() -> Iterator[ToyTemplate]:
    template = ToyTemplate()
    REGISTRY["toy"] = template  # the one registry line a new template needs
    try:
        yield template
    finally:
        del REGISTRY["toy"]


def toy_env(**config: Any) -> dict[str, Any]:
    return {
        "slug": "toy-env",
        "template": "TOY-COUNTER",  # an alias, as users may type it
        "config": config,
        "tasks": [
            {"instruction": "Bump the counter to 3.", "hiddenGroundTruth": {"count": 3}},
            {"instruction": "Bump it to 2.", "hiddenGroundTruth": {"count": 2}, "split": "test"},
        ],
    }


def test_toy_template_unknown_until_registered() -> None:
    problems = validate_environment(toy_env())
    assert problems and problems[0].startswith("template: unknown template 'TOY-COUNTER'")


def test_toy_template_is_validated_through_its_module(toy: ToyTemplate) -> None:
    assert validate_environment(toy_env(limit=5)) == []
    assert EnvironmentSpec.model_validate(toy_env()).template == "toy"
    problems = validate_environment(toy_env(limit=2, start=2, extra=1))
    assert "config.extra: unknown key (check the spelling)" in " ".join(problems)
    problems = validate_environment(toy_env(limit=2, start=2))
    assert "config.start: 2 is not below config.limit (2)" in problems
    assert "tasks[0].hiddenGroundTruth.count: above config.limit (2)" in problems
    bad_state = toy_env()
    bad_state["tasks"][0]["hiddenGroundTruth"] = {"total": 3}
    assert any(
        p.startswith("tasks[0].hiddenGroundTruth.total: not in the environment's state")
        for p in validate_environment(bad_state)
    )
    bad_tool = toy_env()
    bad_tool["verifier"] = [{"name": "t", "type": "tool_was_called", "tool": "reset"}]
    assert validate_environment(bad_tool) == [
        "verifier.primitives[0].tool: unknown tool 'reset' (tools: bump)"
    ]
    spec = EnvironmentSpec.model_validate(toy_env())
    assert [p.type for p in default_verifier(spec, spec.tasks[0]).primitives] == ["state_match"]
    # Its config model is its own contract: exported as schemas/templates/toy.json.
    assert "limit" in json_schemas()["templates/toy.json"]["properties"]


async def test_toy_template_runs_in_rollout_test_and_scripted_demos(
    toy: ToyTemplate, tmp_path: Path
) -> None:
    from rollout.cli.localtest import _run_env
    from rollout.shared.agent.loop import DEFAULT_SYSTEM_PROMPT, SamplingParams
    from rollout.shared.learning.scripted import ScriptedPlayer, scripted_rollouts

    env_file = tmp_path / "toy_env.py"
    env_file.write_text(
        "from rollout import Environment, Task\n"
        "env = Environment(slug='toy-env', template='toy-counter', config={'limit': 4}, tasks=[\n"
        "    Task(instruction='Bump the counter to 3.', hidden_ground_truth={'count': 3}),\n"
        "    Task(instruction='Bump it to 2.', hidden_ground_truth={'count': 2}, split='test'),\n"
        "])\n"
    )
    spec = EnvironmentSpec.model_validate(toy_env(limit=4))
    # `rollout test`'s loop, with the scripted player (the toy's plan) as the model.
    report = await _run_env(
        spec, [0, 1], ScriptedPlayer(tmp_path), SamplingParams(), DEFAULT_SYSTEM_PROMPT, 20
    )
    train, test = report["tasks"]
    assert train["passed"] is True and train["score"] == 1.0
    assert [c["name"] for c in train["toolCalls"]] == ["bump"] * 3
    assert test["passed"] is False  # the player knows train tasks only

    rollouts, counts = await scripted_rollouts([env_file])
    assert counts == {"toy-env": {"tasks": 1, "planned": 1, "passed": 1}}
    assert rollouts[0]["trajectory"]["final_state"] == {"count": 3}

    runtime = build_runtime(spec, 0)
    assert isinstance(runtime, ToyRuntime) and runtime.limit == 4
    await runtime.close()
