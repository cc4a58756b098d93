"""Crash safety: SIGKILL the learner mid-job; a new one resumes from the last checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from learner_kit import (
    Platform,
    job_events,
    kill,
    ready_client,
    scripted_run,
    shut_down,
    start_learner,
    wait_for_event,
)

from rollout.shared.learning.checkpoints import read_step_log

pytestmark = pytest.mark.slow

STEPS = 120


async def test_sigkill_mid_job_resumes_from_the_object_store_and_completes(
    learner_env, agent_server, tiny_model: Path, tmp_path: Path
) -> None:
    platform = Platform(learner_env)
    for name in ("env-registry", "tracker", "verifier", "actor", "buffer"):
        platform.start(name)
    log = tmp_path / "learner.log"
    # A short AckWait: the dead learner's job is redelivered within seconds.
    learner = start_learner(learner_env, log, ROLLOUT_LEARNER_ACK_WAIT_S="3")
    client = await ready_client(learner_env, platform.check)
    try:
        run = await scripted_run(client, agent_server, n=4)
        job = await client.create_training_job(
            base_model=f"hf:{tiny_model}", method="sft", source_run_id=run["runId"],
            hyperparams={"max_steps": STEPS, "save_every": 10, "batch_size": 1,
                         "learning_rate": 1e-3},
        )  # fmt: skip
        js = await client.jetstream()
        first = await wait_for_event(js, job["id"], "checkpoint.saved", limit_s=180)
        await kill(learner)
        before = await job_events(js, job["id"])
        assert "job.completed" not in {e.type for e in before}, "finished before the kill"
        reported = max(e.payload["step"] for e in before if e.type == "job.progress")
        # The machine's copy is gone too: the checkpoint must come from the object store.
        out_dir = learner_env.home / "learner" / "jobs" / job["id"]
        shutil.rmtree(out_dir)

        learner = start_learner(learner_env, log, ROLLOUT_LEARNER_ACK_WAIT_S="3")
        done = await wait_for_event(js, job["id"], "job.completed", limit_s=300)
        events = await job_events(js, job["id"])
    finally:
        await shut_down(learner, client, platform)

    metrics = done.payload["metrics"]
    assert metrics["steps"] == STEPS, log.read_text()[-3000:]
    resumed = int(metrics["resumed_from_step"])
    assert first.payload["step"] <= resumed < STEPS
    steps = [e.payload["step"] for e in events if e.type == "job.progress"]
    # No step is reported twice, and none after the kill repeats one reported before it.
    assert steps == sorted(set(steps)) and steps[-1] == STEPS
    assert steps[: steps.index(reported) + 1] == [s for s in steps if s <= reported]
    saved = [e.payload["step"] for e in events if e.type == "checkpoint.saved"]
    assert len(saved) == len(set(saved)) and saved[-1] == STEPS
    # The resumed trainer's own step log starts right after the checkpoint it resumed from.
    logged = [entry["step"] for entry in read_step_log(out_dir)]
    assert logged == list(range(resumed + 1, STEPS + 1))
