"""A reward model length past the model's own positions is refused before it is used.

A conversation longer than the model's `max_position_embeddings` but under `maxLength` (or
PPO's `reward_model_max_length`) was fed whole: a model with learnt positions fails on it,
and a RoPE model (Llama) scores it on positions it never learnt, silently. The primitive's
limit is checked at plan time (env push, `rollout run`), PPO's at job creation and at the
learner's start; a version with fewer positions met only at scoring time fails the
conversations it cannot read, with the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from learner_kit import SHORT_RM_POSITIONS, refund_env

from rollout.errors import RolloutError
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs.engine import score
from rollout.shared.envs.validation import validate_environment
from rollout.shared.learning import TrainConfig
from rollout.shared.learning.ppo import PPOLearner
from rollout.shared.learning.rm_scoring import RewardScorer
from rollout.shared.models import trained
from rollout.shared.objectstore import sha256_file

NAME = "local/tiny-agent:short-judge"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test's ROLLOUT_HOME, whose object store trained names resolve from."""
    monkeypatch.setenv("ROLLOUT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ROLLOUT_OBJECT_STORE_URL", raising=False)
    monkeypatch.setenv("ROLLOUT_HF_THREADS", "1")
    yield tmp_path / "home"


def _publish(model_dir: Path, tmp: Path) -> None:
    """Publish a folder as version 1 of NAME, as the learner does."""

    async def go() -> None:
        store = trained.default_store()
        try:
            archive = trained.pack_dir(model_dir, tmp / f"{trained.policy_key(NAME)}.tar")
            sha, _ = sha256_file(archive)
            ref = await store.put(f"models/{sha}.tar", archive)
            record = trained.PolicyRecord(
                model=NAME, version=1, uri=ref.uri, sha256=ref.sha256, size=ref.size
            )
            await trained.publish_record(store, record)
        finally:
            await store.close()

    asyncio.run(go())


def _env(**params: Any) -> dict[str, Any]:
    env = refund_env(tasks=2, slug="refunds-short-rm")
    env["verifier"] = {
        "primitives": [{"name": "judge", "type": "reward_model", "model": NAME} | params]
    }
    return env


def test_a_max_length_past_the_models_positions_is_refused_at_plan_time(
    short_rm: Path, home: Path, tmp_path: Path
) -> None:
    _publish(short_rm, tmp_path)
    for params in ({}, {"maxLength": SHORT_RM_POSITIONS + 1}):  # the default is 2048
        [problem] = validate_environment(_env(**params))
        length = params.get("maxLength", 2048)
        assert problem == (
            f"verifier.primitives[0].maxLength: {length} is more tokens than reward model "
            f"{NAME!r} reads: its config.json has max_position_embeddings {SHORT_RM_POSITIONS};"
            f" set it to {SHORT_RM_POSITIONS} or less"
        )
    assert validate_environment(_env(maxLength=SHORT_RM_POSITIONS)) == []


def test_a_conversation_past_the_models_positions_fails_at_scoring_with_the_reason(
    short_rm: Path, home: Path, tmp_path: Path
) -> None:
    # The env was checked against another version; the one scored with now has fewer
    # positions than maxLength: the conversation it cannot read fails, it is not fed whole.
    _publish(short_rm, tmp_path)
    env = _env(maxLength=4 * SHORT_RM_POSITIONS)
    messages = [
        {"role": "user", "content": "Refund order O-1 in full"},
        {"role": "assistant", "content": "Refunding it now. " * 60},
    ]
    scorer = RewardScorer(short_rm, max_len=4 * SHORT_RM_POSITIONS)
    [tokens] = scorer.token_counts([messages])
    assert SHORT_RM_POSITIONS < tokens <= 4 * SHORT_RM_POSITIONS
    verdict = asyncio.run(score(env, 1, Trajectory(messages=messages)))
    [prim] = verdict.primitives
    assert (prim.score, prim.passed) == (0.0, False)
    assert f"more than reward model {NAME} v1 reads" in prim.reason, prim.reason
    assert f"(max_position_embeddings {SHORT_RM_POSITIONS} in its config.json" in prim.reason
    assert f"under maxLength {4 * SHORT_RM_POSITIONS})" in prim.reason
    # The scorer itself (PPO's rescoring calls it) never reads it either.
    with pytest.raises(
        RolloutError, match=f"longer than the reward model reads \\({SHORT_RM_POSITIONS}\\)"
    ):
        scorer.score([messages])


def test_ppo_refuses_a_reward_model_max_length_past_the_models_positions(
    short_rm: Path, tiny_model: Path, tmp_path: Path
) -> None:
    config = TrainConfig(method="ppo", reward_model_max_length=SHORT_RM_POSITIONS * 2)
    with pytest.raises(RolloutError) as caught:
        PPOLearner(tiny_model, tmp_path / "p", config, resume=False, reward_model=short_rm)
    assert str(caught.value).startswith(
        f"hyperparams.reward_model_max_length: {SHORT_RM_POSITIONS * 2} is more tokens than "
        f"reward model '{short_rm}' reads: its config.json has max_position_embeddings "
        f"{SHORT_RM_POSITIONS}"
    )
    assert not (tmp_path / "p").exists()  # refused before anything was loaded or written
