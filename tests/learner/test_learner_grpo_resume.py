"""Crash safety for online GRPO and on-policy distillation: SIGKILL the learner mid-job; a new
one resumes and completes."""

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

from rollout.services.learner.online_jobs import MAX_EMPTY_RUNS, round_request_id
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.learning.checkpoints import read_step_log

pytestmark = pytest.mark.slow

STEPS = 6
PLATFORM = ("env-registry", "tracker", "verifier", "actor", "buffer")


async def policy_versions(js, model: str) -> list[int]:
    """The versions policy.updated announced for `model`, in stream order."""
    found = []
    async for msg in read_events(js, subjects.aggregate_events("policy")):
        payload = EventEnvelope.from_bytes(msg.data).payload
        if payload["model"] == model:
            found.append(payload["version"])
    return found


async def round_runs(js, job_id: str, method: str = "grpo") -> list[str]:
    """The client request id of every run the job's rounds requested, in stream order."""
    found = []
    async for msg in read_events(js, subjects.event_filter("run", "run.requested")):
        payload = EventEnvelope.from_bytes(msg.data).payload
        if payload["name"] == f"{job_id} {method}":
            found.append(payload["request_id"])
    return found


@pytest.mark.parametrize("method", ["grpo", "opd"])
async def test_sigkill_mid_online_job_resumes_from_its_last_checkpoint_and_completes(
    learner_env, tiny_model: Path, tmp_path: Path, method: str
) -> None:
    platform = Platform(learner_env)
    for name in PLATFORM:
        platform.start(name)
    log = tmp_path / "learner.log"
    # A short AckWait: the dead learner's job is redelivered within seconds.
    learner = start_learner(learner_env, log, ROLLOUT_LEARNER_ACK_WAIT_S="3")
    client = await ready_client(learner_env, platform.check)
    base = f"hf:{tiny_model}"
    try:
        await client.push_environment(letters_env())
        # Distillation's teacher is only loaded, never trained: the base itself serves here.
        extra = {"teacher": base} if method == "opd" else {}
        job = await client.create_training_job(
            base_model=base, method=method, env_slug="letters", suffix="rl",
            hyperparams={"max_steps": STEPS, "group_size": 3, "max_staleness": 1,
                         "tasks_per_step": 2, "max_tokens": 12, "max_tool_calls": 1,
                         "learning_rate": 1e-3, **extra},
        )  # fmt: skip
        js = await client.jetstream()
        # Version 0 is saved before any step: wait for a checkpoint of a trained version.
        first = await wait_for_event(
            js, job["id"], "checkpoint.saved", limit_s=180, where=lambda c: c.step >= 1
        )
        await kill(learner)
        started_before = await round_runs(js, job["id"], method)
        before = await job_events(js, job["id"])
        assert "job.completed" not in {e.type for e in before}, "finished before the kill"
        reported = [e.payload["step"] for e in before if e.type == "job.progress"]
        # The machine's copy is gone too: the checkpoint must come from the object store.
        out_dir = learner_env.home / "learner" / "jobs" / job["id"]
        shutil.rmtree(out_dir)

        learner = start_learner(learner_env, log, ROLLOUT_LEARNER_ACK_WAIT_S="3")
        done = await wait_for_event(js, job["id"], "job.completed", limit_s=300)
        events = await job_events(js, job["id"])
        versions = await policy_versions(js, f"{base}:rl")
        started = await round_runs(js, job["id"], method)
    finally:
        await shut_down(learner, client, platform)

    metrics = done.payload["metrics"]
    assert metrics["steps"] == STEPS, log.read_text()[-3000:]
    resumed = int(metrics["resumed_from_step"])
    assert first.payload["step"] <= resumed < STEPS
    steps = [e.payload["step"] for e in events if e.type == "job.progress"]
    # No step is reported twice, and the steps reported before the kill stay as they were.
    assert steps == list(range(1, STEPS + 1)), steps
    assert steps[: len(reported)] == reported
    saved = [e.payload["step"] for e in events if e.type == "checkpoint.saved"]
    assert saved == sorted(set(saved)) and saved[-1] == STEPS
    # Versions only go up, each announced once: actors never see an older policy again.
    assert versions == list(range(STEPS + 1)), versions
    # One run per round (step, try): the resumed learner asked for the runs the killed one
    # had in flight by the same request ids and got them back, never a fresh run for a round.
    rounds = {
        round_request_id(job["id"], step, attempt): (step, attempt)
        for step in range(1, STEPS + 1)
        for attempt in range(MAX_EMPTY_RUNS + 1)
    }
    assert set(started) <= set(rounds), started
    assert len(started) == len(set(started))
    assert sorted(rounds[r][0] for r in started if rounds[r][1] == 0) == list(range(1, STEPS + 1))
    # The killed learner had started the run of the round after its checkpoint: the resumed
    # one, asking for that round again, used it (no second run for the round above).
    assert any(rounds[r][0] > resumed for r in started_before), (started_before, resumed)
    # The resumed learner's own step log starts right after the checkpoint it resumed from.
    logged = [entry["policy_version"] for entry in read_step_log(out_dir)]
    assert logged == list(range(resumed + 1, STEPS + 1))
