"""Online GRPO with no signal: every sample of every task scores the same, so it stops."""

from __future__ import annotations

from pathlib import Path

import pytest
from learner_kit import job_events, wait_for_event
from pipeline.kit import refund_env

from rollout.services.learner import online_jobs
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events


async def test_a_job_whose_rewards_never_differ_fails_with_the_reason(
    client, tiny_model: Path, learner_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It used to sample round after round, forever, re-saving the same version each time.
    monkeypatch.setattr(online_jobs, "MAX_FLAT_ROUNDS", 2)
    env = refund_env(tasks=2, slug="never")
    # No reply of the tiny model contains this: every completion scores 0.
    env["verifier"] = {"primitives": [{"name": "x", "type": "contains_terms", "terms": ["qzxqzx"]}]}
    await client.push_environment(env)
    job = await client.create_training_job(
        base_model=f"hf:{tiny_model}", method="grpo", env_slug="never", suffix="flat",
        hyperparams={"max_steps": 2, "group_size": 2, "max_staleness": 0, "tasks_per_step": 1,
                     "max_tokens": 6, "max_tool_calls": 1},
    )  # fmt: skip
    js = await client.jetstream()
    failed = await wait_for_event(js, job["id"], "job.failed", limit_s=240)
    assert "got the same reward" in failed.payload["reason"]
    assert "nothing to learn from" in failed.payload["reason"]
    events = await job_events(js, job["id"])
    assert not [e for e in events if e.type == "job.progress"]
    # Only the starting version was announced: skipped steps publish nothing.
    policies = [m async for m in read_events(js, subjects.aggregate_events("policy"))]
    assert len(policies) == 1
