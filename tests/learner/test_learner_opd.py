"""On-policy distillation through the platform: the student samples on the env through actor
runs, the learner scores its tokens with the teacher and publishes each version."""

from __future__ import annotations

from pathlib import Path

import pytest
from learner_kit import job_events, letters_env, wait_for_event

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def teacher(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its output layer perturbed: a teacher that disagrees with it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("teacher") / "model"
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.add_(torch.randn(head.shape, generator=generator) * 5 * head.std())
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(tiny_model)).save_pretrained(str(out))
    return out


async def test_opd_job_samples_on_the_env_and_learns_from_the_teacher(
    client, tiny_model: Path, teacher: Path, learner_env
) -> None:
    await client.push_environment(letters_env())
    base = f"hf:{tiny_model}"
    job = await client.create_training_job(
        base_model=base, method="opd", env_slug="letters", suffix="opd",
        hyperparams={"teacher": f"hf:{teacher}", "max_steps": 2, "tasks_per_step": 2,
                     "max_staleness": 0, "max_tokens": 12, "max_tool_calls": 1,
                     "learning_rate": 1e-3},
    )  # fmt: skip
    model = f"{base}:opd"
    js = await client.jetstream()
    done = await wait_for_event(js, job["id"], "job.completed", limit_s=300)
    assert done.payload["model_id"] == model
    policies = [
        EventEnvelope.from_bytes(m.data).payload
        async for m in read_events(js, subjects.aggregate_events("policy"))
    ]
    assert [(p["model"], p["version"]) for p in policies] == [(model, 0), (model, 1), (model, 2)]
    events = await job_events(js, job["id"])
    progress = [e.payload for e in events if e.type == "job.progress"]
    assert [p["step"] for p in progress] == [1, 2]
    # The progress `kl` is the reverse KL to the teacher: the perturbed head disagrees a lot.
    assert all(p["kl"] is not None and p["kl"] > 0.1 for p in progress), [p["kl"] for p in progress]
    # One sample a task (group_size 1) is enough: no group needs two rewards to differ.
    runs = [r for r in await client.list_runs(50) if r["model"] == model]
    assert runs and all(r["n"] == 1 for r in runs if "n" in r)
