"""Bad training requests: a clear error naming the problem, and no job left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAI, Reply, completion
from learner_kit import all_job_events, hopeless_agent, refund_env, scripted_run

from rollout.errors import RolloutError
from rollout.generate import prompts_environment
from rollout.shared import subjects
from rollout.shared.contracts.requests import Reply as ServiceReply


async def refused(client, **job) -> str:
    """The error text of a refused job request."""
    with pytest.raises(RolloutError) as caught:
        await client.create_training_job(**job)
    return str(caught.value)


async def test_bad_requests_get_clear_errors_and_append_nothing(
    client, agent_server, tiny_model: Path, tmp_path: Path, learner_env, monkeypatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    good = await scripted_run(client, agent_server, n=2)
    with FakeOpenAI(hopeless_agent) as hopeless:
        bad = await client.create_run("refunds", f"{hopeless.base_url}#nope", n=2)
        bad = await client.wait_for_run(bad["runId"], timeout_s=120)
    assert bad["status"] == "completed" and bad["passed"] == 0
    base = f"hf:{tiny_model}"
    # What `rollout generate` pushes for prompts without answers: one verdict for any reply.
    unjudged = prompts_environment([{"instruction": "Say hi."}, {"instruction": "Say bye."}])
    await client.push_environment(unjudged)
    junk = tmp_path / "junk-model"
    junk.mkdir()
    (junk / "config.json").write_text('{"model_type": "no-such-architecture"}')

    cases = [
        (
            {"base_model": base, "method": "sft", "source_run_id": bad["runId"]},
            f"run {bad['runId']} has no passing rollouts to fine-tune on",
        ),
        (
            {
                "base_model": base,
                "method": "ppo",
                "source_run_id": good["runId"],
                "hyperparams": {"max_steps": 1},
            },
            "env_slug: online training needs an environment",
        ),
        (
            {"base_model": "hf:/no/such/model", "method": "sft", "source_run_id": good["runId"]},
            "no model directory at /no/such/model",
        ),
        (
            {"base_model": f"hf:{junk}", "method": "sft", "source_run_id": good["runId"]},
            "cannot load a model config and tokenizer",
        ),
        (
            {"base_model": "magic/model", "method": "sft", "source_run_id": good["runId"]},
            "base_model: cannot fine-tune 'magic/model'",
        ),
        (
            {
                "base_model": f"{base}:never-trained",
                "method": "sft",
                "source_run_id": good["runId"],
            },
            "no trained model",
        ),
        ({"base_model": base, "method": "sft", "source_run_id": "nope"}, "no run 'nope'"),
        ({"base_model": base, "method": "sft"}, "source_run_id: sft trains on a run's rollouts"),
        (
            {
                "base_model": base,
                "method": "sft",
                "source_run_id": good["runId"],
                "rollout_ids": ["not-a-rollout"],
            },
            "rollout_ids: 1 id(s) are not rollouts of run",
        ),
        (
            {
                "base_model": base,
                "method": "sft",
                "source_run_id": good["runId"],
                "hyperparams": {"learning_rat": 0.1, "epochs": -1},
            },
            "hyperparams.learning_rat: unknown setting",
        ),
        (
            {
                "base_model": base,
                "method": "sft",
                "source_run_id": good["runId"],
                "suffix": "no spaces",
            },
            "suffix: suffix 'no spaces'",
        ),
        ({"base_model": base, "method": "grpo", "hyperparams": {"max_steps": 2}}, "env_slug"),
        (
            {
                "base_model": base,
                "method": "grpo",
                "env_slug": unjudged["slug"],
                "hyperparams": {"max_steps": 2},
            },
            f"environment {unjudged['slug']!r} judges nothing",
        ),
        (
            {"base_model": base, "method": "grpo", "env_slug": "refunds"},
            "hyperparams.max_steps: required for grpo",
        ),
        (
            {"base_model": base, "method": "dpo", "source_run_id": bad["runId"]},
            "has no preference pairs for DPO",
        ),
        (
            {"base_model": "openai/gpt-4o-mini", "method": "grpo", "env_slug": "refunds"},
            "online GRPO trains local weights",
        ),
        # Distillation's teacher is checked before any sampling run starts.
        (
            {
                "base_model": base,
                "method": "opd",
                "env_slug": "refunds",
                "hyperparams": {"max_steps": 1},
            },
            "hyperparams.teacher:",
        ),
        (
            {
                "base_model": base,
                "method": "opd",
                "env_slug": "refunds",
                "hyperparams": {"max_steps": 1, "teacher": "hf:/no/such/teacher"},
            },
            "hyperparams.teacher: hf:/no/such/teacher: no model directory",
        ),
        (
            {
                "base_model": base,
                "method": "opd",
                "env_slug": "refunds",
                "hyperparams": {"max_steps": 1, "teacher": "openai/gpt-4o-mini"},
            },
            "hyperparams.teacher: 'openai/gpt-4o-mini' is a openai model",
        ),
        (
            {
                "base_model": base,
                "method": "opd",
                "env_slug": "refunds",
                "hyperparams": {"max_steps": 1, "teacher": f"{base}:never-trained"},
            },
            "hyperparams.teacher: no trained model",
        ),
        (
            {
                "base_model": base,
                "method": "opd",
                "env_slug": "refunds",
                "hyperparams": {"max_steps": 1, "teacher": base, "dynamic_sampling": True},
            },
            "dynamic_sampling: distillation learns from the teacher",
        ),  # fmt: skip
        # The methods beyond SFT/DPO/GRPO refuse what they cannot train on, by path.
        (
            {"base_model": base, "method": "kto", "source_run_id": bad["runId"]},
            "nothing for KTO to weigh: every rollout failed",
        ),
        (
            {"base_model": base, "method": "rm", "source_run_id": bad["runId"]},
            "has no preference pairs for a reward model",
        ),
        (
            {
                "base_model": base,
                "method": "kto",
                "source_run_id": good["runId"],
                "hyperparams": {"batch_size": 1},
            },
            "hyperparams.batch_size: KTO needs at least 2 examples per batch",
        ),
        (
            {
                "base_model": base,
                "method": "dpo",
                "source_run_id": good["runId"],
                "hyperparams": {"loss_type": "magic"},
            },
            "hyperparams.loss_type: must be one of",
        ),
        (
            {
                "base_model": base,
                "method": "sft",
                "source_run_id": good["runId"],
                "hyperparams": {"beta": 0.1},
            },
            "hyperparams.beta: unknown setting",
        ),
        (
            {"base_model": "openai/gpt-4o-mini", "method": "rm", "source_run_id": good["runId"]},
            "a reward model trains local weights",
        ),
    ]
    for job, expected in cases:
        text = await refused(client, **job)
        assert expected in text, (job, text)
        assert "Traceback" not in text
    # A run where nothing passed says what would give SFT something to learn from.
    text = await refused(client, **cases[0][0])
    assert "SFT learns from passing ones only" in text and "-n 8" in text, text
    # Both hyperparameter problems are named at once.
    text = await refused(client, **cases[9][0])
    assert "hyperparams.epochs: must be > 0" in text

    # A method the contract does not know is refused before it reaches the learner...
    assert "invalid training job" in await refused(client, base_model=base, method="magic")
    # ...and by the learner itself when a caller sends it anyway.
    nc = client._nc
    raw = json.dumps({"base_model": base, "method": "magic", "source_run_id": good["runId"]})
    msg = await nc.request(subjects.request("learner", "create_job"), raw.encode(), timeout=30)
    reply = ServiceReply.model_validate_json(msg.data)
    assert not reply.ok and any("method" in p for p in reply.problems), reply

    js = await client.jetstream()
    assert await all_job_events(js) == []
    assert await client.list_training_jobs() == []


@pytest.mark.slow
async def test_run_still_running_is_refused(client, tiny_model: Path, learner_env) -> None:
    await client.push_environment(refund_env())
    # A slow agent: the run is still going when the job is asked for.
    with FakeOpenAI(lambda body: Reply(completion("thinking..."), delay=3.0)) as slow:
        run = await client.create_run("refunds", f"{slow.base_url}#slow", n=1, max_tool_calls=0)
        text = await refused(
            client, base_model=f"hf:{tiny_model}", method="sft", source_run_id=run["runId"]
        )
        assert "only completed runs can be trained on" in text
