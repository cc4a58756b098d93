"""Scoring one generated batch: a raising verifier marks its rollout errored, never the batch.

Errors are typed. A rollout the actor could not generate stays errored with its cause and
kind. A verifier that raises is the environment's fault: errored (kind `env`) at once. When
the platform fails the verifier (no sandbox for `tests_pass`, an object store that cannot
give back a claim-checked trajectory) `score_rollout` raises ScoringUnavailable, so the
caller retries the batch and records the rollout errored (kind `infra`) only on its last
attempt: never a reward of 0 or a failed verdict for something nobody judged. Anything else
that stops a batch being scored (the run's env spec missing or no longer valid, a lookup that
keeps failing) is retried the same way, then errored with its cause (`failure_kind`).

A verifier with a `ruler` primitive judges the samples of one task together (`scoring_units`,
`score_task_group`): one judge call per group, rewards relative within it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.events import (
    ErrorKind,
    GeneratedRollout,
    PrimitiveScore,
    ScoredRollout,
)
from rollout.shared.contracts.trajectory import Trajectory, VerifierResult
from rollout.shared.envs.coerce import as_task
from rollout.shared.envs.engine import score
from rollout.shared.envs.verifiers.engine import score_group
from rollout.shared.envs.verifiers.ruler import judged_in_groups
from rollout.shared.errors import RetrySignal, RolloutError
from rollout.shared.objectstore import ObjectStore
from rollout.shared.objectstore.errors import ObjectStoreError
from rollout.shared.store.trajectories import load_trajectory


class ScoringUnavailable(RetrySignal):
    """The platform could not score a rollout right now (sandbox, object store): retry."""


def failure_kind(exc: BaseException) -> ErrorKind:
    """Whose fault a failed env spec lookup is: the environment's or the platform's."""
    # A spec that is missing, no longer validates, or not the one the run expected; anything
    # else (a NATS timeout, a lookup that keeps failing) is the platform's.
    if isinstance(exc, RolloutError | pydantic.ValidationError):
        return "env"
    return "infra"


def unscored(rollout: GeneratedRollout, cause: str, kind: ErrorKind) -> ScoredRollout:
    """A rollout nothing could score: errored with `cause`, or with its own generation error."""
    if rollout.error and rollout.trajectory is None and rollout.trajectory_uri is None:
        return errored_verdict(rollout, rollout.error, rollout.error_kind or "env")
    return errored_verdict(rollout, cause, kind)


def errored_verdict(
    rollout: GeneratedRollout | ScoredRollout, cause: str, kind: ErrorKind
) -> ScoredRollout:
    """The record of a rollout that got no verdict (or one too large to send), with what broke."""
    return ScoredRollout(
        rollout_id=rollout.rollout_id,
        task_index=rollout.task_index,
        sample_index=rollout.sample_index,
        score=0.0,
        passed=False,
        error=cause,
        outcome="errored",
        error_kind=kind,
    )


async def _raw_trajectory(rollout: GeneratedRollout, store: ObjectStore | None) -> Any:
    """The rollout's trajectory JSON, fetched from `store` when claim-checked."""
    raw = rollout.trajectory
    if raw is None and rollout.trajectory_uri:
        if store is None:
            raise ScoringUnavailable(
                f"rollout {rollout.rollout_id}'s trajectory is at {rollout.trajectory_uri}, "
                "but this verifier has no object store"
            )
        try:
            raw = await load_trajectory(
                store, None, rollout.trajectory_uri, rollout.trajectory_sha256
            )
        except (ObjectStoreError, OSError) as exc:
            raise ScoringUnavailable(f"object store: {exc}") from exc
    return raw


def _not_generated(rollout: GeneratedRollout) -> bool:
    return bool(rollout.error) and rollout.trajectory is None and rollout.trajectory_uri is None


def _verdict(rollout: GeneratedRollout, result: VerifierResult) -> ScoredRollout:
    """The verdict on one rollout from its verifier result (errored if it was cut short)."""
    # A primitive's result has a PrimitiveScore's fields: its field dict validates as one, in
    # the verdict's own validation (no dump and no model per primitive first).
    primitives = [p.__dict__ for p in result.primitives]
    if rollout.error:
        # The episode was cut short (the model endpoint failed, the env broke): the verdict
        # on what it left is kept for reading, but it is no verdict on the model.
        errored = errored_verdict(rollout, rollout.error, rollout.error_kind or "env")
        scores = [PrimitiveScore(**p) for p in primitives]
        return errored.model_copy(update={"primitives": scores})
    return ScoredRollout(
        rollout_id=rollout.rollout_id,
        task_index=rollout.task_index,
        sample_index=rollout.sample_index,
        score=result.score,
        passed=result.passed,
        primitives=primitives,
        # What the verdict's validator would set (saying it skips an attribute assignment).
        outcome="passed" if result.passed else "failed",
    )


async def score_rollout(
    spec: EnvironmentSpec, rollout: GeneratedRollout, store: ObjectStore | None = None
) -> ScoredRollout:
    """The verdict on one rollout (its trajectory fetched from `store` when claim-checked)."""
    if _not_generated(rollout):
        return errored_verdict(rollout, rollout.error, rollout.error_kind or "env")
    raw = await _raw_trajectory(rollout, store)
    try:
        trajectory = Trajectory.model_validate(raw or {})
        result = await score(spec, rollout.task_index, trajectory)
    except Exception as exc:  # noqa: BLE001 (a user's verifier may raise anything: record it)
        return errored_verdict(rollout, f"verifier raised {type(exc).__name__}: {exc}", "env")
    if result.error:
        # A primitive could not run (InfraError: e.g. the sandbox is unavailable).
        raise ScoringUnavailable(f"verifier could not run: {result.error}")
    return _verdict(rollout, result)


def scoring_units(
    spec: EnvironmentSpec, rollouts: list[GeneratedRollout]
) -> list[list[GeneratedRollout]]:
    """How a batch is scored: one rollout at a time, or, when the verifier judges groups
    (`ruler`), the samples of each task together (in order of first appearance)."""
    if not judged_in_groups(spec):
        return [[r] for r in rollouts]
    groups: dict[int, list[GeneratedRollout]] = {}
    for r in rollouts:
        groups.setdefault(r.task_index, []).append(r)
    return list(groups.values())


async def score_task_group(
    spec: EnvironmentSpec, rollouts: list[GeneratedRollout], store: ObjectStore | None = None
) -> list[ScoredRollout]:
    """The verdicts on the samples of one task, judged together: one judge call per group, so
    each sample's reward is relative to the others (what GRPO's advantage compares).

    Rollouts the actor could not finish are left out of the group (errored, no reward); a
    judge that fails or answers malformed JSON raises ScoringUnavailable (retried, then every
    sample errored with the cause): never a made-up reward. A sample the judge cannot read
    even alone fails on its own and the rest are judged without it, in parts when they are too
    long for the judge together (ruler.judge_group).
    """
    verdicts: dict[str, ScoredRollout] = {}
    judged: list[tuple[GeneratedRollout, Trajectory]] = []
    for r in rollouts:
        if r.error:
            verdicts[r.rollout_id] = errored_verdict(r, r.error, r.error_kind or "env")
            continue
        raw = await _raw_trajectory(r, store)
        try:
            judged.append((r, Trajectory.model_validate(raw or {})))
        except pydantic.ValidationError as exc:
            cause = f"verifier raised ValidationError: {exc.errors()[0]['msg']}"
            verdicts[r.rollout_id] = errored_verdict(r, cause, "env")
    if judged:
        try:
            task = as_task(spec, judged[0][0].task_index)
            results = await score_group(spec, task, [t for _, t in judged])
        except Exception as exc:  # noqa: BLE001 (a user's verifier may raise anything: record it)
            for r, _ in judged:
                cause = f"verifier raised {type(exc).__name__}: {exc}"
                verdicts[r.rollout_id] = errored_verdict(r, cause, "env")
        else:
            failed = next((res.error for res in results if res.error), None)
            if failed:
                raise ScoringUnavailable(f"verifier could not run: {failed}")
            for (r, _), result in zip(judged, results, strict=True):
                verdicts[r.rollout_id] = _verdict(r, result)
    return [verdicts[r.rollout_id] for r in rollouts]


async def prefetched(
    rollouts: list[GeneratedRollout], store: ObjectStore | None
) -> list[GeneratedRollout]:
    """The batch with its claim-checked trajectories read at once (their reads overlap).

    A read that fails leaves its rollout as it was: scoring it reads again and reports why.
    """
    if store is None:
        return rollouts

    async def one(rollout: GeneratedRollout) -> GeneratedRollout:
        if rollout.trajectory is not None or not rollout.trajectory_uri:
            return rollout
        try:
            raw = await _raw_trajectory(rollout, store)
        except ScoringUnavailable:
            return rollout
        return rollout.model_copy(update={"trajectory": raw})

    return list(await asyncio.gather(*(one(r) for r in rollouts)))
