"""A verifier primitive is one module: its parameter model beside its scorer, registered by type.

A toy primitive defined only in this file is unknown until registered, then validated (its
parameters by path), scored and exported as a schema, without any other module naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec
from rollout.shared.contracts.export import json_schemas
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs import validate_environment
from rollout.shared.envs.verifiers import REGISTRY, score_spec
from rollout.shared.envs.verifiers.registry import Outcome, ScoreContext, register


class WordCountParams(CamelModel):
    """`word_count`: the final answer has at least `minWords` words."""

    min_words: int = Field(1, ge=1, le=1000)


@pytest.fixture
def word_count() -> Iterator[None]:
    @register("word_count", WordCountParams)  # the one line a new primitive needs
    def score(p: WordCountParams, ctx: ScoreContext) -> Outcome:
        words = len((ctx.trajectory.final_output or "").split())
        ok = words >= p.min_words
        return Outcome(min(1.0, words / p.min_words), ok, f"{words} word(s), {p.min_words} needed")

    try:
        yield
    finally:
        del REGISTRY["word_count"]


def env(**params: object) -> dict:
    return {
        "slug": "words",
        "template": "custom",
        "config": {"tools": []},
        "tasks": [{"instruction": "Say something long."}],
        "verifier": [{"name": "long", "type": "word_count", **params}],
    }


def test_a_primitive_is_unknown_until_registered() -> None:
    problems = validate_environment(env(minWords=3))
    assert any("word_count" in p and "unknown" in p for p in problems), problems


async def test_a_registered_primitive_is_validated_scored_and_exported(word_count: None) -> None:
    assert validate_environment(env(minWords=3)) == []
    problems = validate_environment(env(minWords=0))
    assert any(p.startswith("verifier.primitives[0].minWords") for p in problems), problems
    spec = EnvironmentSpec.model_validate(env(minWords=3))
    result = await score_spec(spec, spec.tasks[0], Trajectory(final_output="one two"))
    assert (result.passed, result.primitives[0].reason) == (False, "2 word(s), 3 needed")
    result = await score_spec(spec, spec.tasks[0], Trajectory(final_output="one two three"))
    assert result.passed and result.score == 1.0
    assert json_schemas()["primitives/word_count.json"]["properties"]["minWords"]["minimum"] == 1


@pytest.mark.parametrize("type_name", sorted(REGISTRY))
def test_each_builtin_primitive_is_one_module(type_name: str) -> None:
    primitive = REGISTRY[type_name]
    code = primitive.compile or primitive.scorer
    # Its parameter model lives in the module that scores it, and that module is its own.
    assert primitive.params.__module__ == code.__module__
    module = importlib.import_module(code.__module__)
    assert module.__name__.rsplit(".", 1)[-1] == type_name
