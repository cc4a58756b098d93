"""The one registry of verifier primitives: type name -> params model, scorer, tool fields."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollout.shared.contracts.envspec import (
    PRIMITIVE_PARAMS,
    CamelModel,
    EnvironmentSpec,
    TaskSpec,
)
from rollout.shared.contracts.trajectory import Trajectory


@dataclass
class Outcome:
    """What one primitive decided: score in [0, 1], pass/fail, and why."""

    score: float
    passed: bool
    reason: str


class InfraError(Exception):
    """The primitive could not run (e.g. no sandbox): the result carries an error, not a verdict."""


@dataclass
class ScoreContext:
    """Everything a primitive may look at."""

    spec: EnvironmentSpec
    task: TaskSpec
    trajectory: Trajectory
    config: Any = None  # the template's typed config, when it parses

    @property
    def ground_truth(self) -> Any:
        """The task's hidden ground truth."""
        return self.task.hidden_ground_truth

    @property
    def state(self) -> dict[str, Any]:
        """The final state of the episode."""
        return self.trajectory.final_state or {}


Scorer = Callable[[Any, ScoreContext], Outcome | Awaitable[Outcome]]
# A plan-time check of parsed params beyond their model: (param key, problem) pairs.
Check = Callable[[Any], list[tuple[str, str]]]


@dataclass
class PrimitiveDef:
    """A registered primitive type."""

    type: str
    params: type[CamelModel]
    scorer: Scorer
    # Params that name tools (str or list[str]): validation checks they exist in the env.
    tool_fields: tuple[str, ...] = field(default_factory=tuple)
    # Templates this primitive makes sense for (None: any).
    templates: tuple[str, ...] | None = None
    # Checks that look outside the spec (e.g. that a named model exists), run by validation.
    check: Check | None = None


REGISTRY: dict[str, PrimitiveDef] = {}


def register(
    type_name: str,
    *,
    tool_fields: tuple[str, ...] = (),
    templates: tuple[str, ...] | None = None,
    check: Check | None = None,
) -> Callable[[Scorer], Scorer]:
    """Decorator: register a scorer under its type, with the params model from the contracts."""

    def wrap(fn: Scorer) -> Scorer:
        REGISTRY[type_name] = PrimitiveDef(
            type_name, PRIMITIVE_PARAMS[type_name], fn, tool_fields, templates, check
        )
        return fn

    return wrap


def known_types() -> list[str]:
    """Registered primitive type names, sorted."""
    return sorted(REGISTRY)
