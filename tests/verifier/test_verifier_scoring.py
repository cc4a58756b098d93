"""The verifier's typed verdicts, one rollout at a time (real sandbox, real object store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline.kit import FIXED, fix_env

from rollout.services.verifier.scoring import ScoringUnavailable, score_rollout
from rollout.shared.contracts.events import GeneratedRollout, ScoredRollout
from rollout.shared.envs.coerce import as_spec
from rollout.shared.envs.sandbox import BWRAP_ENV_VAR
from rollout.shared.objectstore import open_store


def generated(files: dict[str, str] | None = None, **fields) -> GeneratedRollout:
    """A rollout of task 0 that ended with `files` (the fix, by default)."""
    state = {"files": files if files is not None else {"calc.py": FIXED}}
    return GeneratedRollout(
        rollout_id="r0",
        task_index=0,
        sample_index=0,
        model="m",
        trajectory={"final_state": state},
        **fields,
    )


async def test_a_fix_passes_and_no_fix_fails_with_verdicts() -> None:
    spec = as_spec(fix_env())
    good = await score_rollout(spec, generated())
    bad = await score_rollout(spec, generated({"calc.py": "def add(a, b):\n    return 0\n"}))
    assert (good.outcome, good.passed, good.error_kind) == ("passed", True, None)
    assert (bad.outcome, bad.passed, bad.error) == ("failed", False, None)


async def test_no_sandbox_is_no_verdict_but_a_retryable_failure(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(BWRAP_ENV_VAR, str(tmp_path / "gone"))
    with pytest.raises(ScoringUnavailable, match="gone"):
        await score_rollout(as_spec(fix_env()), generated())


async def test_an_object_store_that_cannot_give_the_trajectory_back_is_retryable(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "objects")
    uri = store.uri_for("trajectories/missing.json")
    rollout = generated().model_copy(update={"trajectory": None, "trajectory_uri": uri})
    with pytest.raises(ScoringUnavailable, match="object store"):
        await score_rollout(as_spec(fix_env()), rollout, store)


async def test_a_rollout_the_actor_could_not_generate_stays_errored_with_its_kind() -> None:
    rollout = generated().model_copy(
        update={"trajectory": None, "error": "endpoint down", "error_kind": "model"}
    )
    verdict = await score_rollout(as_spec(fix_env()), rollout)
    assert (verdict.outcome, verdict.error_kind, verdict.error) == (
        "errored",
        "model",
        "endpoint down",
    )
    assert verdict.passed is False and verdict.score == 0.0


def test_old_verdicts_without_an_outcome_get_one_and_errored_never_counts() -> None:
    base = {"rollout_id": "r", "task_index": 0, "sample_index": 0}
    assert ScoredRollout(**base, score=1.0, passed=True).outcome == "passed"
    assert ScoredRollout(**base, score=0.2, passed=False).outcome == "failed"
    errored = ScoredRollout(**base, score=0.7, passed=True, error="sandbox gone")
    assert (errored.outcome, errored.passed, errored.score) == ("errored", False, 0.0)
