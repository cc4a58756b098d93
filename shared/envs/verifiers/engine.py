"""Scoring a trajectory: run each primitive, weight the scores, pass only when all pass."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from rollout.shared.contracts.envspec import EnvironmentSpec, PrimitiveSpec, TaskSpec, VerifierSpec
from rollout.shared.contracts.trajectory import PrimitiveResult, Trajectory, VerifierResult
from rollout.shared.envs.memo import per_object, validated
from rollout.shared.envs.templates import get_template, typed_config
from rollout.shared.envs.templates.protocol import STATE_MATCH
from rollout.shared.envs.verifiers import env_reward as _env_reward  # noqa: F401  (registers)
from rollout.shared.envs.verifiers import primitives as _primitives  # noqa: F401  (registers)
from rollout.shared.envs.verifiers import reward_model as _rm  # noqa: F401  (registers)
from rollout.shared.envs.verifiers import (
    ruler as _ruler,  # registers it; ruler_group judges a group
)
from rollout.shared.envs.verifiers import verifiers_rubric as _vf  # noqa: F401  (registers)
from rollout.shared.envs.verifiers.registry import (
    REGISTRY,
    Compiled,
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


# One primitive of a verifier, ready to score: (spec, its definition, its params bound by
# the definition's compile hook or None, the _Prepared for the general path).
_Step = tuple[PrimitiveSpec, "PrimitiveDef | None", "Compiled | None", _Prepared]


def _step(prim: PrimitiveSpec) -> _Step:
    prep = _prepare(prim)
    definition = prep.definition
    compiled = None
    if prep.failed is None and definition is not None and definition.compile is not None:
        try:
            compiled = definition.compile(prep.params)
        except Exception:  # noqa: BLE001  (the scorer compiles again and reports it per score)
            compiled = None
    return prim, definition, compiled, prep


def _bound(prim: PrimitiveSpec) -> tuple[PrimitiveDef | None, Compiled | None, _Prepared]:
    # A _Step without the spec itself: per_object's value must not refer to its key object,
    # or every primitive ever scored alone (run_primitive) would be kept alive.
    return _step(prim)[1:]


class _Plan:
    """A verifier's steps, valid while the registry's generation is the one they came from;
    `fast` holds (name, type, weight, compiled, spec) when every step is compiled."""

    __slots__ = ("generation", "steps", "fast")

    def __init__(self, verifier: VerifierSpec) -> None:
        self.generation = -1
        self.steps: list[_Step] = []
        self.fast: list[tuple[str, str, float, Compiled, PrimitiveSpec]] | None = None
        self.refresh(verifier)

    def refresh(self, verifier: VerifierSpec) -> None:
        """Rebuild the steps from the registry as it is now."""
        self.generation = REGISTRY.generation
        self.steps = [_step(prim) for prim in verifier.primitives]
        fast = [(p.name, p.type, p.weight, c, p) for p, _, c, _ in self.steps if c is not None]
        self.fast = fast if len(fast) == len(self.steps) else None


def _plan(verifier: VerifierSpec) -> _Plan:
    # Specs are immutable once built: a verifier's params are parsed and bound once.
    plan = per_object(verifier, _Plan)
    if plan.generation != REGISTRY.generation:
        plan.refresh(verifier)
    return plan


def _failed(prim: PrimitiveSpec, exc: Exception) -> tuple[float, bool, str, str | None]:
    """(score, passed, reason, infra error) of a compiled primitive that raised, as _start."""
    if isinstance(exc, InfraError):
        return 0.0, False, f"could not run: {exc}", f"{prim.name}: {exc}"
    log.warning("primitive_failed", primitive=prim.name, error=repr(exc))
    return 0.0, False, f"error: {type(exc).__name__}: {exc}", None


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
    # Compiled and sync scorers (most) finish without a coroutine of their own.
    step = per_object(prim, _bound)
    if step[0] is not REGISTRY.get(prim.type):  # registered (or replaced) since
        step = _bound(prim)
    compiled, prep = step[1], step[2]
    if compiled is not None:
        try:
            return Outcome(*compiled(ctx.trajectory, ctx.task)), None
        except Exception as exc:  # a primitive bug must not lose the whole score
            value, ok, reason, infra = _failed(prim, exc)
            return Outcome(value, ok, reason), infra
    outcome, infra = _start(prep, prim, ctx)
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


def _verifier(spec: EnvironmentSpec, task: TaskSpec) -> VerifierSpec:
    verifier = spec.verifier
    if verifier and verifier.primitives:
        return verifier
    return _default_verifier(spec, task)


def score_now(
    spec: EnvironmentSpec, task: TaskSpec, trajectory: Trajectory
) -> VerifierResult | None:
    """score_spec's verdict without a coroutine when every primitive is compiled (sync),
    else None (then await score_spec)."""
    fast = _plan(_verifier(spec, task)).fast
    if fast is None:
        return None
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    total = weighted = 0.0
    passed = True
    for name, kind, weight, compiled, prim in fast:
        try:
            value, ok, reason = compiled(trajectory, task)
        except Exception as exc:  # a primitive bug must not lose the whole score
            value, ok, reason, infra = _failed(prim, exc)
            if infra:
                errors.append(infra)
        value = float(value)
        if not 0.0 < value <= 1.0:  # NaN and -0.0 too: they become 0.0
            value = min(1.0, max(0.0, value))
        ok = bool(ok)
        results.append(
            {
                "name": name,
                "type": kind,
                "weight": weight,
                "score": value,
                "passed": ok,
                "reason": reason,
            }
        )
        total += weight
        weighted += weight * value
        passed = passed and ok
    return _verdict(results, errors, total, weighted, passed)


def _verdict(
    results: list[dict[str, Any]], errors: list[str], total: float, weighted: float, passed: bool
) -> VerifierResult:
    if total > 0:
        score = weighted / total
        if not math.isfinite(total):
            score = _overflowed_mean([(r["weight"], r["score"]) for r in results])
    else:
        score = 1.0 if results and passed else 0.0
    # The primitives as dicts: pydantic builds their models in the same (one) validation.
    # Validated, not built trusted: reasons come from primitives (a plugin may register its
    # own), and pydantic's validator costs no more than building the models by hand.
    return _verifier_result(
        {
            "score": score,
            "passed": bool(results) and passed,
            "primitives": results,
            "error": "; ".join(errors) or None,
        }
    )


_verifier_result = VerifierResult.__pydantic_validator__.validate_python


def _overflowed_mean(pairs: list[tuple[float, float]]) -> float:
    """The weighted mean of (weight, score) pairs whose weights' sum overflows a float.

    Each weight is finite, but two of 1e308 add up to inf: the score was inf / inf = NaN, which
    no consumer accepts (the buffer skipped the verdict and the run never ended), or 0. The
    weights' ratios to the largest give the same mean.
    """
    top = max(w for w, _ in pairs)
    return sum(w / top * s for w, s in pairs) / sum(w / top for w, _ in pairs)


async def score_spec(
    spec: EnvironmentSpec, task: TaskSpec, trajectory: Trajectory
) -> VerifierResult:
    """Score a trajectory of `task` under `spec`'s verifier (or the default one)."""
    done = score_now(spec, task, trajectory)
    if done is not None:
        return done
    ctx: ScoreContext | None = None  # built for the first primitive that is not compiled
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    total = weighted = 0.0
    passed = True
    for prim, _, compiled, prep in _plan(_verifier(spec, task)).steps:
        if compiled is not None:
            try:
                value, ok, reason = compiled(trajectory, task)
                infra = None
            except Exception as exc:  # a primitive bug must not lose the whole score
                value, ok, reason, infra = _failed(prim, exc)
        else:
            if ctx is None:
                ctx = ScoreContext(spec, task, trajectory, _config(spec))
            outcome, infra = _start(prep, prim, ctx)
            if type(outcome) is not Outcome and inspect.isawaitable(outcome):
                outcome, infra = await _finish(outcome, prim)
            value, ok, reason = outcome.score, outcome.passed, outcome.reason
        value = float(value)
        if not 0.0 < value <= 1.0:  # NaN and -0.0 too: they become 0.0
            value = min(1.0, max(0.0, value))
        ok = bool(ok)
        results.append(
            {
                "name": prim.name,
                "type": prim.type,
                "weight": prim.weight,
                "score": value,
                "passed": ok,
                "reason": reason,
            }
        )
        if infra:
            errors.append(infra)
        total += prim.weight
        weighted += prim.weight * value
        passed = passed and ok
    return _verdict(results, errors, total, weighted, passed)


def _config(spec: EnvironmentSpec) -> Any:
    try:
        return typed_config(spec)
    except (ValidationError, ValueError):
        return None


async def score_group(
    spec: EnvironmentSpec, task: TaskSpec, group: list[Trajectory]
) -> list[VerifierResult]:
    """Score the n samples of one task: `ruler` primitives judge the whole group in one call
    (relative scores, usable as GRPO rewards); every other primitive scores each sample."""
    verifier: VerifierSpec = (
        spec.verifier
        if spec.verifier and spec.verifier.primitives
        else default_verifier(spec, task)
    )
    try:
        config = typed_config(spec)
    except (ValidationError, ValueError):
        config = None
    per_sample: list[list[PrimitiveResult]] = [[] for _ in group]
    errors: list[list[str]] = [[] for _ in group]
    for prim in verifier.primitives:
        if prim.type == "ruler":
            for i, (result, infra) in enumerate(await _ruler.ruler_group(prim, task, group)):
                per_sample[i].append(result)
                if infra:
                    errors[i].append(infra)
            continue
        for i, trajectory in enumerate(group):
            ctx = ScoreContext(spec=spec, task=task, trajectory=trajectory, config=config)
            result, infra = await run_primitive(prim, ctx)
            per_sample[i].append(result)
            if infra:
                errors[i].append(infra)
    out = []
    for results, errs in zip(per_sample, errors, strict=True):
        total = sum(r.weight for r in results)
        if total > 0:
            value = sum(r.weight * r.score for r in results) / total
            if not math.isfinite(total):
                value = _overflowed_mean([(r.weight, r.score) for r in results])
        else:
            value = 1.0 if results and all(r.passed for r in results) else 0.0
        out.append(
            VerifierResult(
                score=value,
                passed=bool(results) and all(r.passed for r in results),
                primitives=results,
                error="; ".join(errs) or None,
            )
        )
    return out
