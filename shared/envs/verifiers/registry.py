"""The one registry of verifier primitives: type name -> params model, scorer, tool fields."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollout.shared.contracts.envspec import (
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
# A sync scorer with its params bound once: (trajectory, task) -> (score, passed, reason).
Compiled = Callable[[Trajectory, TaskSpec], tuple[float, bool, str]]
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
    # Parsed params -> Compiled: the engine binds a verifier's params once (per spec) and
    # scores with a plain call; `scorer` is the same function through the Scorer signature.
    compile: Callable[[Any], Compiled] | None = None
    # Ground-truth keys the scorer reads when its own param is unset: {key: param field}.
    # Validation checks each task's value as that param (a wrong type would crash scoring).
    truth_fields: dict[str, str] = field(default_factory=dict)


class _Registry(dict[str, PrimitiveDef]):
    """A dict that counts its changes: a verifier's plan, built from the definitions it held,
    is rebuilt when `generation` moved (a type registered, replaced or removed since)."""

    generation = 0

    def __setitem__(self, key: str, value: PrimitiveDef) -> None:
        super().__setitem__(key, value)
        self.generation += 1

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.generation += 1

    def __ior__(self, other: Any) -> _Registry:
        self.update(other)
        return self

    def _changed(self, result: Any) -> Any:
        self.generation += 1
        return result

    def pop(self, *args: Any) -> Any:  # type: ignore[override]
        """dict.pop, counted."""
        return self._changed(super().pop(*args))

    def popitem(self) -> tuple[str, PrimitiveDef]:
        """dict.popitem, counted."""
        return self._changed(super().popitem())

    def clear(self) -> None:
        """dict.clear, counted."""
        self._changed(super().clear())

    def update(self, *args: Any, **kwargs: Any) -> None:
        """dict.update, counted."""
        self._changed(super().update(*args, **kwargs))

    def setdefault(self, key: str, default: Any = None) -> Any:
        """dict.setdefault, counted."""
        return self._changed(super().setdefault(key, default))


REGISTRY: _Registry = _Registry()


def register(
    type_name: str,
    params: type[CamelModel],
    *,
    tool_fields: tuple[str, ...] = (),
    templates: tuple[str, ...] | None = None,
    check: Check | None = None,
    truth_fields: dict[str, str] | None = None,
) -> Callable[[Scorer], Scorer]:
    """Decorator: register a scorer under its type, with the model of its parameters."""

    def wrap(fn: Scorer) -> Scorer:
        REGISTRY[type_name] = PrimitiveDef(
            type_name, params, fn, tool_fields, templates, check, truth_fields=truth_fields or {}
        )
        return fn

    return wrap


def register_compiled(
    type_name: str,
    params: type[CamelModel],
    *,
    tool_fields: tuple[str, ...] = (),
    templates: tuple[str, ...] | None = None,
    check: Check | None = None,
) -> Callable[[Callable[[Any], Compiled]], Callable[[Any], Compiled]]:
    """Decorator: register a sync primitive written as `compile(params) -> Compiled`.

    Its scorer is `Outcome(*compile(params)(ctx.trajectory, ctx.task))`: one implementation,
    which the engine calls without rebuilding anything derived from the params per score.
    """

    def wrap(compile_fn: Callable[[Any], Compiled]) -> Callable[[Any], Compiled]:
        def scorer(params: Any, ctx: ScoreContext) -> Outcome:
            return Outcome(*compile_fn(params)(ctx.trajectory, ctx.task))

        scorer.__name__ = scorer.__qualname__ = type_name
        scorer.__doc__ = compile_fn.__doc__
        REGISTRY[type_name] = PrimitiveDef(
            type_name,
            params,
            scorer,
            tool_fields,
            templates,
            check,
            compile_fn,
        )
        return compile_fn

    return wrap


def known_types() -> list[str]:
    """Registered primitive type names, sorted."""
    return sorted(REGISTRY)
