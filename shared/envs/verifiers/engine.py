"""Scoring a trajectory: run each primitive, weight the scores, pass only when all pass."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from rollout.shared.contracts.envspec import EnvironmentSpec, PrimitiveSpec, TaskSpec, VerifierSpec
from rollout.shared.contracts.trajectory import PrimitiveResult, Trajectory, VerifierResult
from rollout.shared.envs.memo import per_object, validated
from rollout.shared.envs.verifiers import env_reward as _env_reward  # noqa: F401  (registers)
from rollout.shared.envs.verifiers import primitives as _primitives  # noqa: F401  (registers)
from rollout.shared.envs.verifiers import reward_model as _rm  # noqa: F401  (registers)
from rollout.shared.envs.verifiers import ruler as _ruler  # noqa: F401  (registers)
from rollout.shared.envs.verifiers import verifiers_rubric as _vf  # noqa: F401  (registers)
from rollout.shared.envs.verifiers.registry import (
    REGISTRY,
    InfraError,
    Outcome,
    PrimitiveDef,
    ScoreContext,
)

log = structlog.get_logger(__name__)


def default_verifier(spec: EnvironmentSpec, task: TaskSpec) -> VerifierSpec:
    """The verifier used when the env has none: the template's default primitives.

    That is state_match against the hidden ground truth unless the template says otherwise
    (sql `query`/`rows` -> sql_result_match; code-editing `files` -> state_match on those
    files, `tests` -> tests_pass; remote envs -> env_reward; verifiers -> its rubric).
    """
    from rollout.shared.envs.templates import get_template
    from rollout.shared.envs.templates.protocol import STATE_MATCH

    template = get_template(spec.template)
    prims = template.default_primitives(task) if template is not None else [dict(STATE_MATCH)]
    return VerifierSpec.model_validate({"primitives": prims})


def _no_defaults(task: TaskSpec) -> dict[str, VerifierSpec]:
    return {}


def _default_verifier(spec: EnvironmentSpec, task: TaskSpec) -> VerifierSpec:
    # Built once per (task, template): a fresh one each score would re-parse its params too.
    known = per_object(task, _no_defaults)
    verifier = known.get(spec.template)
    if verifier is None:
        verifier = known[spec.template] = default_verifier(spec, task)
    return verifier


def _params_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "params"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True)
class _Prepared:
    """A primitive's definition and parsed params, or the verdict when it cannot run."""

    definition: PrimitiveDef | None
    params: Any = None
    failed: Outcome | None = None


def _prepare(prim: PrimitiveSpec) -> _Prepared:
    definition = REGISTRY.get(prim.type)
    if definition is None:
        return _Prepared(None, failed=Outcome(0.0, False, f"unknown primitive type {prim.type!r}"))
    try:
        params = definition.params.model_validate(prim.params)
    except ValidationError as exc:
        return _Prepared(
            definition, failed=Outcome(0.0, False, f"invalid params: {_params_error(exc)}")
        )
    return _Prepared(definition, params)


def _prepared(prim: PrimitiveSpec) -> _Prepared:
    # A spec's params are parsed once (specs are immutable once built); a type registered
    # since then is looked up again.
    prep = per_object(prim, _prepare)
    if prep.definition is not REGISTRY.get(prim.type):
        prep = _prepare(prim)
    return prep


def _plan(verifier: VerifierSpec) -> list[tuple[PrimitiveSpec, _Prepared]]:
    return [(prim, _prepare(prim)) for prim in verifier.primitives]


def _start(prep: _Prepared, prim: PrimitiveSpec, ctx: ScoreContext) -> tuple[Any, str | None]:
    """Call the scorer: its Outcome, or the awaitable an async scorer returned."""
    if prep.failed is not None:
        return prep.failed, None
    try:
        return prep.definition.scorer(prep.params, ctx), None  # type: ignore[union-attr]
    except InfraError as exc:
        return Outcome(0.0, False, f"could not run: {exc}"), f"{prim.name}: {exc}"
    except Exception as exc:  # a primitive bug must not lose the whole score
        log.warning("primitive_failed", primitive=prim.name, error=repr(exc))
        return Outcome(0.0, False, f"error: {type(exc).__name__}: {exc}"), None


async def _finish(pending: Any, prim: PrimitiveSpec) -> tuple[Any, str | None]:
    """Await an async scorer, with the same failures as _start."""
    try:
        return await pending, None
    except InfraError as exc:
        return Outcome(0.0, False, f"could not run: {exc}"), f"{prim.name}: {exc}"
    except Exception as exc:  # a primitive bug must not lose the whole score
        log.warning("primitive_failed", primitive=prim.name, error=repr(exc))
        return Outcome(0.0, False, f"error: {type(exc).__name__}: {exc}"), None


async def _outcome(prim: PrimitiveSpec, ctx: ScoreContext) -> tuple[Any, str | None]:
    # Sync scorers (most) finish without a coroutine of their own.
    outcome, infra = _start(_prepared(prim), prim, ctx)
    if type(outcome) is not Outcome and inspect.isawaitable(outcome):
        outcome, infra = await _finish(outcome, prim)
    return outcome, infra


def _fields(prim: PrimitiveSpec, outcome: Any) -> dict[str, Any]:
    """A PrimitiveResult's fields: the score clamped to [0, 1]."""
    score = float(outcome.score)
    if not 0.0 < score <= 1.0:  # NaN and -0.0 too: they become 0.0
        score = min(1.0, max(0.0, score))
    return {
        "name": prim.name,
        "type": prim.type,
        "weight": prim.weight,
        "score": score,
        "passed": bool(outcome.passed),
        "reason": outcome.reason,
    }


async def run_primitive(
    prim: PrimitiveSpec, ctx: ScoreContext
) -> tuple[PrimitiveResult, str | None]:
    """Score one primitive; a bad or crashing primitive fails with its reason, never raises."""
    outcome, infra = await _outcome(prim, ctx)
    return validated(PrimitiveResult, _fields(prim, outcome)), infra


async def score_spec(
    spec: EnvironmentSpec, task: TaskSpec, trajectory: Trajectory
) -> VerifierResult:
    """Score a trajectory of `task` under `spec`'s verifier (or the default one)."""
    verifier = spec.verifier if spec.verifier and spec.verifier.primitives else None
    verifier = verifier or _default_verifier(spec, task)
    try:
        config = spec.typed_config()
    except (ValidationError, ValueError):
        config = None
    ctx = ScoreContext(spec=spec, task=task, trajectory=trajectory, config=config)
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    total = weighted = 0.0
    passed = True
    # The verifier's params parsed once per spec (see _prepared).
    for prim, prep in per_object(verifier, _plan):
        if prep.definition is not REGISTRY.get(prim.type):
            prep = _prepare(prim)
        outcome, infra = _start(prep, prim, ctx)
        if type(outcome) is not Outcome and inspect.isawaitable(outcome):
            outcome, infra = await _finish(outcome, prim)
        fields = _fields(prim, outcome)
        results.append(fields)
        if infra:
            errors.append(infra)
        weight = fields["weight"]
        total += weight
        weighted += weight * fields["score"]
        passed = passed and fields["passed"]
    if total > 0:
        value = weighted / total
    else:
        value = 1.0 if results and passed else 0.0
    verdict = {
        "score": value,
        "passed": bool(results) and passed,
        # Dicts: pydantic builds the PrimitiveResults in the same (one) validation.
        "primitives": results,
        "error": "; ".join(errors) or None,
    }
    return validated(VerifierResult, verdict)
