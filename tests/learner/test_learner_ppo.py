"""Online PPO through the platform: `rollout improve --method ppo` drives actor runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from learner_kit import all_job_events, job_events, letters_env, wait_for_event
from test_learner_cli import cli

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.learning.ppo import VALUE_HEAD

SETTINGS = ("--set", "tasks_per_step=2", "--set", "max_tokens=12", "--set", "max_tool_calls=1",
            "--set", "learning_rate=0.001", "--set", "kl_coef=0.1")  # fmt: skip


@pytest.mark.slow
async def test_improve_method_ppo_drives_actors_and_publishes_each_version(
    client, tiny_model: Path, learner_env
) -> None:
    await client.push_environment(letters_env())
    base = f"hf:{tiny_model}"
    improved = await cli(
        learner_env, "improve", "--method", "ppo", "--env", "letters", "--model", base,
        "--suffix", "ppo", "--steps", "2", "-n", "2", "--max-staleness", "1", *SETTINGS,
        "--follow", "--json", limit_s=400,
    )  # fmt: skip
    assert improved.returncode == 0, improved.stderr[-3000:]
    job = json.loads(improved.stdout)
    model = f"{base}:ppo"
    assert (job["status"], job["modelId"], job["method"]) == ("completed", model, "ppo")
    js = await client.jetstream()
    policies = [
        EventEnvelope.from_bytes(m.data).payload
        async for m in read_events(js, subjects.aggregate_events("policy"))
    ]
    assert [(p["model"], p["version"]) for p in policies] == [(model, 0), (model, 1), (model, 2)]
    # Each trained version carries the actor-vs-learner gap its step measured.
    assert all(0.0 <= p["off_policy"]["mismatch_kl"] < 0.05 for p in policies[1:]), policies
    events = await job_events(js, job["id"])
    progress = [e.payload for e in events if e.type == "job.progress"]
    assert [p["step"] for p in progress] == [1, 2]
    assert all(p["loss"] is not None and abs(p["loss"]) < 1e6 for p in progress)
    done = next(e for e in events if e.type == "job.completed")
    assert done.payload["metrics"]["runs"] >= 2

    # The policy moved, and its critic travels with every checkpoint.
    out = learner_env.home / "learner" / "jobs" / job["id"] / "checkpoints" / "policy-000002"
    assert (out / VALUE_HEAD).is_file()
    from safetensors.torch import load_file

    before, after = (
        load_file(tiny_model / "model.safetensors"),
        load_file(out / "model.safetensors"),
    )
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # The runs are ordinary runs of the trained name, each rollout with its policy version.
    runs = [r for r in await client.list_runs(50) if r["model"] == model]
    assert len(runs) == done.payload["metrics"]["runs"]
    for run in runs:
        assert run["split"] == "train"
        full = await client.get_run(run["runId"], include_rollouts=True)
        assert {r["policyVersion"] for r in full["rollouts"]} <= {0, 1, 2}


async def test_bad_ppo_settings_are_refused_with_their_path(
    client, tiny_model: Path, short_rm: Path, learner_env
) -> None:
    await client.push_environment(letters_env())
    base = f"hf:{tiny_model}"
    cases = [
        ({"max_steps": 2, "clip_range": 2, "lam": -1}, "hyperparams.clip_range: must be <= 1"),
        ({"max_steps": 2, "ppo_epochs": 0}, "hyperparams.ppo_epochs: must be >= 1"),
        ({"clip_range": 0.1}, "hyperparams.max_steps: required for ppo"),
        ({"max_steps": 2, "reward_model": base}, f"reward_model: {base!r} is not a reward model"),
        ({"max_steps": 2, "reward_model": "nothing:trained"}, "no trained reward model"),
        # Longer than the model has positions for: such a conversation was fed to it whole.
        (
            {"max_steps": 2, "reward_model": f"hf:{short_rm}", "reward_model_max_length": 512},
            f"hyperparams.reward_model_max_length: 512 is more tokens than reward model "
            f"'hf:{short_rm}' reads: its config.json has max_position_embeddings 256",
        ),
    ]
    for hyperparams, expected in cases:
        with pytest.raises(RolloutError) as caught:
            await client.create_training_job(
                base_model=base, method="ppo", env_slug="letters", hyperparams=hyperparams
            )
        assert expected in str(caught.value), (hyperparams, str(caught.value))
    with pytest.raises(RolloutError, match="env_slug: no environment 'nope'"):
        await client.create_training_job(
            base_model=base, method="ppo", env_slug="nope", hyperparams={"max_steps": 1}
        )
    assert await all_job_events(await client.jetstream()) == []


@pytest.mark.slow
async def test_ppo_job_rewarded_by_a_trained_reward_model(
    client, tiny_model: Path, learner_env, tmp_path: Path
) -> None:
    from rollout.shared.learning import TrainConfig
    from rollout.shared.learning.rm import train_rm

    pairs = [
        {"prompt": [{"role": "user", "content": f"Refund order O-{i}."}],
         "chosen": [{"role": "assistant", "content": f"Refunded order O-{i} in full."}],
         "rejected": [{"role": "assistant", "content": "No."}]}
        for i in range(4)
    ]  # fmt: skip
    config = TrainConfig(method="rm", max_steps=2, learning_rate=1e-3, batch_size=2)
    rm = train_rm(tiny_model, pairs, tmp_path / "rm", config, resume=False).model_dir
    await client.push_environment(letters_env())
    base = f"hf:{tiny_model}"
    job = await client.create_training_job(
        base_model=base, method="ppo", env_slug="letters", suffix="rm-ppo",
        hyperparams={"max_steps": 1, "group_size": 2, "tasks_per_step": 2, "max_tokens": 8,
                     "max_tool_calls": 0, "reward_model": f"hf:{rm}"},
    )  # fmt: skip
    done = await wait_for_event(await client.jetstream(), job["id"], "job.completed", limit_s=300)
    metrics = done.payload["metrics"]
    # Every completion trained on was scored by the reward model, not the verifier.
    assert metrics["completions_used"] >= 1
    assert metrics["completions_rescored"] == metrics["completions_used"]
