"""KTO, IPO and reward-model jobs end to end: run -> job -> checkpoints, policy; and resume."""

from __future__ import annotations

import math
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

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.learning.checkpoints import FINAL_MODEL, read_step_log

pytestmark = pytest.mark.slow


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    [path] = list(model_dir.glob("*.safetensors"))
    return load_file(str(path))


def _changed(base: Path, trained: Path) -> bool:
    before, after = _weights(base), _weights(trained)
    shared = [k for k in before if k in after and before[k].shape == after[k].shape]
    assert shared, "no weights in common with the base"
    return any(not before[k].equal(after[k]) for k in shared)


@pytest.mark.parametrize(
    ("method", "hyperparams", "recorded"),
    [
        ("kto", {"batch_size": 2}, "kto"),
        ("ipo", {"batch_size": 2, "min_margin": 0.5}, "dpo"),
        ("rm", {"batch_size": 2, "min_margin": 0.5}, "rm"),
    ],
)
async def test_new_methods_train_checkpoint_and_publish(
    client, agent_server, tiny_model: Path, learner_env, method, hyperparams, recorded
) -> None:
    run = await scripted_run(client, agent_server, n=8, seed=7)
    job = await client.create_training_job(
        base_model=f"hf:{tiny_model}", method=method, source_run_id=run["runId"],
        suffix=method, hyperparams={"max_steps": 2, "save_every": 2} | hyperparams,
    )  # fmt: skip
    assert job["method"] == recorded
    js = await client.jetstream()
    done = await wait_for_event(js, job["id"], "job.completed", limit_s=300)
    metrics = done.payload["metrics"]
    assert metrics["steps"] == 2 and math.isfinite(metrics["final_loss"])
    events = await job_events(js, job["id"])
    assert [e.payload["step"] for e in events if e.type == "job.progress"] == [1, 2]
    assert [e.payload["step"] for e in events if e.type == "checkpoint.saved"] == [2]
    [policy] = [
        EventEnvelope.from_bytes(m.data)
        async for m in read_events(js, subjects.aggregate_events("policy"))
    ]
    assert policy.payload["model"] == f"hf:{tiny_model}:{method}"
    assert policy.payload["version"] == 1
    final = learner_env.home / "learner" / "jobs" / job["id"] / FINAL_MODEL
    assert _changed(tiny_model, final)
    if method == "ipo":
        requested = next(e for e in events if e.type == "job.requested")
        assert requested.payload["hyperparams"]["loss_type"] == "ipo"


STEPS = 40


@pytest.mark.parametrize(
    ("method", "hyperparams"),
    [("kto", {}), ("ipo", {"min_margin": 0.5}), ("rm", {"min_margin": 0.5})],
)
async def test_sigkill_mid_job_resumes_with_no_step_done_twice(
    learner_env, agent_server, tiny_model: Path, tmp_path: Path, method, hyperparams
) -> None:
    platform = Platform(learner_env)
    for name in ("env-registry", "tracker", "verifier", "actor", "buffer"):
        platform.start(name)
    log = tmp_path / "learner.log"
    learner = start_learner(learner_env, log, ROLLOUT_LEARNER_ACK_WAIT_S="3")
    client = await ready_client(learner_env, platform.check)
    try:
        run = await scripted_run(client, agent_server, n=8, seed=7)
        job = await client.create_training_job(
            base_model=f"hf:{tiny_model}", method=method, source_run_id=run["runId"],
            hyperparams={"max_steps": STEPS, "save_every": 5, "batch_size": 2,
                         "learning_rate": 1e-3} | hyperparams,
        )  # fmt: skip
        js = await client.jetstream()
        first = await wait_for_event(js, job["id"], "checkpoint.saved", limit_s=180)
        await kill(learner)
        before = await job_events(js, job["id"])
        assert "job.completed" not in {e.type for e in before}, "finished before the kill"
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
    assert steps == sorted(set(steps)) and steps[-1] == STEPS
    saved = [e.payload["step"] for e in events if e.type == "checkpoint.saved"]
    assert len(saved) == len(set(saved)) and saved[-1] == STEPS
    logged = [entry["step"] for entry in read_step_log(out_dir)]
    assert logged == list(range(resumed + 1, STEPS + 1))
