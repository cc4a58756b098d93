"""Crash safety for online PPO: SIGKILL the learner mid-job; a new one resumes and completes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from learner_kit import (
    Platform,
    job_events,
    kill,
    letters_env,
    ready_client,
    shut_down,
    start_learner,
    wait_for_event,
)
from test_learner_grpo_resume import PLATFORM, policy_versions

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.learning.checkpoints import read_step_log
from rollout.shared.learning.ppo import VALUE_HEAD

pytestmark = pytest.mark.slow
STEPS = 5


async def ppo_runs(js, job_id: str) -> list[str]:
    """The client request id of every run the job's PPO rounds requested, in stream order."""
    found = []
    async for msg in read_events(js, subjects.event_filter("run", "run.requested")):
        payload = EventEnvelope.from_bytes(msg.data).payload
        if payload["name"] == f"{job_id} ppo":
            found.append(payload["request_id"])
    return found


async def test_ppo_sigkill_mid_job_resumes_from_its_last_checkpoint_and_completes(
    learner_env, tiny_model: Path, tmp_path: Path
) -> None:
    platform = Platform(learner_env)
    for name in PLATFORM:
        platform.start(name)
    log = tmp_path / "learner.log"
    learner = start_learner(learner_env, log, ROLLOUT_LEARNER_ACK_WAIT_S="3")
    client = await ready_client(learner_env, platform.check)
    base = f"hf:{tiny_model}"
    try:
        await client.push_environment(letters_env())
        job = await client.create_training_job(
            base_model=base, method="ppo", env_slug="letters", suffix="ppo",
            hyperparams={"max_steps": STEPS, "group_size": 2, "max_staleness": 1,
                         "tasks_per_step": 2, "max_tokens": 12, "max_tool_calls": 1,
                         "learning_rate": 1e-3, "kl_coef": 0.1},
        )  # fmt: skip
        js = await client.jetstream()
        first = await wait_for_event(
            js, job["id"], "checkpoint.saved", limit_s=180, where=lambda c: c.step >= 1
        )
        await kill(learner)
        before = await job_events(js, job["id"])
        assert "job.completed" not in {e.type for e in before}, "finished before the kill"
        reported = [e.payload["step"] for e in before if e.type == "job.progress"]
        # The machine's copy is gone too: checkpoint and value head come from the object store.
        out_dir = learner_env.home / "learner" / "jobs" / job["id"]
        shutil.rmtree(out_dir)

        learner = start_learner(learner_env, log, ROLLOUT_LEARNER_ACK_WAIT_S="3")
        done = await wait_for_event(js, job["id"], "job.completed", limit_s=300)
        events = await job_events(js, job["id"])
        versions = await policy_versions(js, f"{base}:ppo")
        started = await ppo_runs(js, job["id"])
    finally:
        await shut_down(learner, client, platform)

    metrics = done.payload["metrics"]
    assert metrics["steps"] == STEPS, log.read_text()[-3000:]
    resumed = int(metrics["resumed_from_step"])
    assert first.payload["step"] <= resumed < STEPS
    steps = [e.payload["step"] for e in events if e.type == "job.progress"]
    # No step is reported (or done) twice; the steps before the kill stay as they were.
    assert steps == list(range(1, STEPS + 1)), steps
    assert steps[: len(reported)] == reported
    saved = [e.payload["step"] for e in events if e.type == "checkpoint.saved"]
    assert saved == sorted(set(saved)) and saved[-1] == STEPS
    assert versions == list(range(STEPS + 1)), versions
    assert len(started) == len(set(started))  # one run per round, never a second one
    logged = [entry["policy_version"] for entry in read_step_log(out_dir)]
    assert logged == list(range(resumed + 1, STEPS + 1))
    assert (out_dir / "checkpoints" / f"policy-{STEPS:06d}" / VALUE_HEAD).is_file()
