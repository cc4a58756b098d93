"""`rollout improve / jobs / job` and trained names in `rollout test`, as a user runs them."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from learner_kit import TESTS_DIR, scripted_run, service_env

from rollout.shared.stack.supervisor import cli_command

pytestmark = pytest.mark.slow


async def cli(settings, *args: str, limit_s: float = 240) -> subprocess.CompletedProcess[str]:
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


async def test_improve_follow_jobs_job_and_trained_name_in_rollout_test(
    client, agent_server, tiny_model: Path, learner_env
) -> None:
    run = await scripted_run(client, agent_server, n=2)
    base = f"hf:{tiny_model}"
    improved = await cli(
        learner_env, "improve", "--run", run["runId"], "--model", base, "--method", "sft",
        "--suffix", "cli", "--learning-rate", "0.001", "--set", "max_steps=3",
        "--set", "batch_size=2", "--follow", "--json",
    )  # fmt: skip
    assert improved.returncode == 0, improved.stderr
    job = json.loads(improved.stdout)
    assert (job["status"], job["modelId"], job["step"]) == ("completed", f"{base}:cli", 3)
    assert job["hyperparams"] == {"learning_rate": 0.001, "max_steps": 3, "batch_size": 2}

    listed = await cli(learner_env, "jobs", "--json")
    assert [j["id"] for j in json.loads(listed.stdout)["jobs"]] == [job["id"]]
    table = await cli(learner_env, "jobs")
    assert job["id"] in table.stdout and "completed" in table.stdout
    shown = await cli(learner_env, "job", job["id"])
    assert shown.returncode == 0, shown.stderr
    assert f"model {base}:cli" in shown.stdout and "step 3/3" in shown.stdout
    followed = await cli(learner_env, "job", job["id"], "--follow")
    assert followed.returncode == 0 and "completed" in followed.stdout

    # The trained name (and the job id) run locally with `rollout test`.
    env_file = TESTS_DIR / "envs" / "seed_examples" / "refund_agent.py"
    for name in (f"{base}:cli", job["id"]):
        tested = await cli(
            learner_env, "test", str(env_file), "--model", name, "--max-tokens", "16",
            "--max-tool-calls", "1", "--json",
        )  # fmt: skip
        report = json.loads(tested.stdout)
        assert "error" not in report, report
        assert tested.returncode in (0, 1), tested.stderr


async def test_improve_bad_input_is_one_clear_line(
    client, agent_server, tiny_model: Path, learner_env
) -> None:
    refused = await cli(learner_env, "improve", "--run", "nope", "--model", f"hf:{tiny_model}")
    assert refused.returncode == 1
    assert "error: source_run_id: no run 'nope'" in refused.stderr
    assert "Traceback" not in refused.stderr
    missing = await cli(learner_env, "improve", "--model", "local/tiny-agent", "--method", "grpo")
    assert missing.returncode == 1 and "--env SLUG is required" in missing.stderr
    # The learner names its settings; each problem also names the flag that set it.
    bad = await cli(
        learner_env, "improve", "--run", "nope", "--model", f"hf:{tiny_model}",
        "--learning-rate", "-1", "--set", "beta=3", "--set", "lora_r=0",
    )  # fmt: skip
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines()[1:] == [
        "  - hyperparams.learning_rate: must be > 0 (--learning-rate)",
        "  - hyperparams.lora_r: must be >= 1 (--set lora_r=VALUE)",
        "  - hyperparams.beta: unknown setting (--set beta: --method sft has no such setting)",
    ], bad.stderr
    unknown = await cli(learner_env, "job", "job-0000000000000000")
    assert unknown.returncode == 1 and "no training job 'job-0000000000000000'" in unknown.stderr


async def test_an_offline_job_given_its_runs_env_records_that_env(
    client, agent_server, tiny_model: Path, learner_env
) -> None:
    run = await scripted_run(client, agent_server, n=2)
    improved = await cli(
        learner_env, "improve", "--run", run["runId"], "--env", run["envSlug"],
        "--model", f"hf:{tiny_model}", "--method", "sft", "--steps", "1", "--follow", "--json",
    )  # fmt: skip
    assert improved.returncode == 0, improved.stderr
    job = json.loads(improved.stdout)
    # --steps caps an offline job's optimizer steps; the lineage names the env it trained on.
    assert (job["status"], job["step"], job["hyperparams"]) == ("completed", 1, {"max_steps": 1})
    assert (job["sourceRunId"], job["envSlug"]) == (run["runId"], "refunds")
