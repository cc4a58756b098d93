"""An online job trains on the env version its request pinned, whatever is pushed later."""

from __future__ import annotations

from pathlib import Path

import pytest
from learner_kit import letters_env

from rollout.errors import RolloutError
from rollout.services.learner.context import LearnerContext
from rollout.services.learner.planning import plan_job, request_of
from rollout.shared.contracts.requests import CreateTrainingJob


async def test_an_online_job_is_planned_again_on_the_version_its_request_pinned(
    client, tiny_model: Path, learner_env, tmp_path: Path
) -> None:
    # A learner resuming a job plans it again from its request: a version pushed since (by
    # anyone's key, with another verifier) must not be the one it then trains on.
    await client.push_environment(letters_env())
    ctx = LearnerContext(None, await client.jetstream(), None, tmp_path)  # type: ignore[arg-type]
    cmd = CreateTrainingJob(
        base_model=f"hf:{tiny_model}", method="grpo", env_slug="letters",
        hyperparams={"max_steps": 1},
    )  # fmt: skip
    first = await plan_job(ctx, cmd)
    assert first.event.env_version == 1 and first.env is not None
    lenient = letters_env()
    lenient["verifier"] = {
        "primitives": [{"name": "anything", "type": "contains_terms", "terms": [""]}]
    }
    assert (await client.push_environment(lenient))["version"] == 2

    again = await plan_job(ctx, request_of(first.event), env_version=first.event.env_version)
    assert again.env is not None and again.event.env_version == again.env.version == 1
    assert again.env.spec_hash == first.env.spec_hash
    newer = await plan_job(ctx, cmd)  # a new job takes the newest
    assert newer.env is not None and newer.event.env_version == 2
    assert newer.env.spec_hash != first.env.spec_hash
    with pytest.raises(RolloutError, match="environment 'letters' has no version 7"):
        await plan_job(ctx, cmd, env_version=7)
