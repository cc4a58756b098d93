"""A shipped example plan runs end to end through the services on CPU (with the session's
tiny model standing in for `local/tiny-agent`, which takes minutes to build).

The online examples (local-grpo, local-ppo, rlhf-rm-ppo) are validated in tests/plans only:
with an untrained model every group scores the same, and the learner's online loop then
requests sampling runs back to back without training (reported with the plans work)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from learner_kit import TESTS_DIR
from test_plan_training import cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

EXAMPLES = TESTS_DIR.parent / "examples"


@pytest.mark.parametrize(("name", "model"), [("distill-sft", "student")])
async def test_example_plan_runs(
    name: str, model: str, client, tiny_model: Path, learner_env
) -> None:
    ran = await cli(
        learner_env, "run", "--config", str(EXAMPLES / f"{name}.toml"),
        "--with", f"{model}=hf:{tiny_model}", "--json", limit_s=900,
    )  # fmt: skip
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    done = json.loads(ran.stdout)
    assert done["status"] == "completed"
    assert all(s["status"] == "completed" for s in done["stages"])
    train = next(s for s in done["stages"] if "jobId" in s["outputs"])
    job = await client.get_training_job(train["outputs"]["jobId"])
    assert job["status"] == "completed" and job["step"] == job["hyperparams"]["max_steps"]
