"""A plan that trains, end to end through the services: run -> sft of a tiny model on the
run's passing rollouts -> evaluate the trained model and its base on the test split ->
compare; then a plan naming that trained policy as a reward model is refused before it starts."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from learner_kit import refund_env, service_env

from rollout.plans import check_plan
from rollout.shared.stack.supervisor import cli_command

pytestmark = pytest.mark.slow


async def cli(settings, *args: str, limit_s: float = 400) -> subprocess.CompletedProcess[str]:
    """Run `rollout ARGS` against the test's platform (off the event loop)."""
    return await asyncio.to_thread(
        subprocess.run,
        cli_command(*args),
        env=service_env(settings, ROLLOUT_LOG_LEVEL="WARNING"),
        capture_output=True,
        text=True,
        timeout=limit_s,
        check=False,
    )


PLAN = """
name = "tiny-sft"
seed = 1
[envs.refunds]
file = "refunds_env.py"
[models]
teacher = "{teacher}"
student = "{student}"
[resources]
threads = 1
[checkpoints]
save_every = 1
[[stages]]
name = "demos"
run = {{ env = "refunds", model = "teacher", n = 2, split = "train", temperature = 0.0 }}
[[stages]]
name = "sft"
train = {{ method = "sft", model = "student", from = "demos", config = {{ max_steps = 2, batch_size = 2, learning_rate = 1e-3 }} }}
[[stages]]
name = "before"
evaluate = {{ env = "refunds", model = "student", split = "test", max_tokens = 16, max_tool_calls = 1 }}
[[stages]]
name = "after"
evaluate = {{ env = "refunds", model = "sft", split = "test", max_tokens = 16, max_tool_calls = 1 }}
[[stages]]
name = "delta"
compare = {{ base = "before", other = "after" }}
"""


async def test_plan_trains_evaluates_and_compares(
    client, agent_server, tiny_model: Path, learner_env, tmp_path: Path
) -> None:
    (tmp_path / "refunds_env.py").write_text(
        f"from rollout import Environment\n\nenv = Environment.from_spec({refund_env(tasks=3)!r})\n"
    )
    path = tmp_path / "plan.toml"
    student = f"hf:{tiny_model}"
    path.write_text(PLAN.format(teacher=f"{agent_server.base_url}#scripted", student=student))

    ran = await cli(learner_env, "run", "--config", str(path), "--json")
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    done = json.loads(ran.stdout)
    assert done["status"] == "completed"
    out = {s["name"]: s["outputs"] for s in done["stages"]}
    # The trained model is BASE:SUFFIX; the plan's seed and checkpoint policy reached the job.
    trained = out["sft"]["model"]
    assert trained.startswith(f"{student}:sft-") and out["sft"]["step"] == 2
    job = await client.get_training_job(out["sft"]["jobId"])
    assert job["sourceRunId"] == out["demos"]["runId"]
    wanted = {"seed": 1, "save_every": 1, "threads": 1, "max_steps": 2}
    assert job["hyperparams"].items() >= wanted.items(), job["hyperparams"]
    after = await client.get_run(out["after"]["runId"])
    assert after["model"] == trained and after["split"] == "test" and after["scored"] == 1
    assert out["delta"]["baseRunId"] == out["before"]["runId"]

    # A trained policy is not a reward model: a plan naming it as one starts nothing.
    bad = tmp_path / "bad.toml"
    bad.write_text(
        f"""
name = "bad-rm"
[envs.refunds]
file = "refunds_env.py"
[models]
policy = "{student}"
[[stages]]
name = "ppo"
train = {{ method = "ppo", model = "policy", env = "refunds", config = {{ reward_model = "{trained}" }} }}
"""
    )
    result = await check_plan(bad, client=client)
    assert len(result.problems) == 1, result.problems
    assert result.problems[0].startswith("stages[0].train.config.reward_model: ")
    assert "is not a reward model" in result.problems[0]
    runs = len(await client.list_runs(100))
    refused = await cli(learner_env, "run", "--config", str(bad))
    assert refused.returncode == 1 and "is not a reward model" in refused.stdout
    assert len(await client.list_runs(100)) == runs
