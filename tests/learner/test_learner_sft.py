"""SFT end to end: scripted run -> job -> checkpoints, policy -> `BASE:SUFFIX` runs; reloads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from learner_kit import job_events, scripted_run, wait_for_event
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.models.trained import TrainedBackend, latest_record
from rollout.shared.objectstore import open_store
from rollout.shared.objectstore.factory import default_store_url

pytestmark = pytest.mark.slow

SFT = {"max_steps": 6, "save_every": 3, "batch_size": 2, "learning_rate": 1e-3}


async def policy_events(js) -> list[EventEnvelope]:
    """Every policy.updated event."""
    return [
        EventEnvelope.from_bytes(m.data)
        async for m in read_events(js, subjects.aggregate_events("policy"))
    ]


async def run_model(client, model: str) -> dict:
    """A short run of `model` on the refund env; the completed run with its rollouts."""
    run = await client.create_run(
        "refunds", model, n=1, max_tokens=24, max_tool_calls=1, split="train", seed=1
    )
    done = await client.wait_for_run(run["runId"], timeout_s=180)
    assert done["status"] == "completed", done
    return await client.get_run(run["runId"], include_rollouts=True)


async def test_sft_job_trains_publishes_and_the_trained_name_runs(
    client, agent_server, tiny_model: Path, learner_env
) -> None:
    run = await scripted_run(client, agent_server, n=4)
    assert run["passed"] > 0
    ids = await client.passing_rollout_ids(run["runId"])
    base = f"hf:{tiny_model}"
    job = await client.create_training_job(
        base_model=base, method="sft", source_run_id=run["runId"], rollout_ids=ids,
        suffix="v1", hyperparams=SFT,
    )  # fmt: skip
    assert job["model"] == f"{base}:v1" and job["trainingRows"] == len(ids)
    js = await client.jetstream()
    done = await wait_for_event(js, job["id"], "job.completed", limit_s=240)
    assert done.payload["model_id"] == f"{base}:v1"
    assert done.payload["metrics"]["steps"] == 6

    events = await job_events(js, job["id"])
    kinds = [e.type for e in events]
    assert kinds[0] == "job.requested" and kinds[-1] == "job.completed"
    steps = [e.payload["step"] for e in events if e.type == "job.progress"]
    assert steps == sorted(set(steps)) and steps[-1] == 6
    checkpoints = [e.payload for e in events if e.type == "checkpoint.saved"]
    assert [c["step"] for c in checkpoints] == [3, 6]
    store = open_store(default_store_url(learner_env.home))
    try:
        for c in checkpoints:  # claim checks: the blob is there with that sha256
            assert await store.get(c["uri"], sha256=c["sha256"])
        record = await latest_record(store, f"{base}:v1")
        assert record is not None and record.version == 1 and record.job_id == job["id"]
        assert await store.exists(done.payload["checkpoint_uri"])
    finally:
        await store.close()
    [policy] = await policy_events(js)
    assert (policy.payload["model"], policy.payload["version"]) == (f"{base}:v1", 1)

    async def projected() -> bool:
        try:
            row = await client.get_training_job(job["id"])
        except RolloutError as exc:
            if "no training job" in str(exc):
                return False  # the tracker has not projected the job's events yet
            raise
        return row["status"] == "completed"

    await wait_until(projected, "the job's read model")
    row = await client.get_training_job(job["id"])
    assert (row["step"], row["totalSteps"], row["modelId"]) == (6, 6, f"{base}:v1")
    assert row["loss"] is not None and row["tokensPerS"] is not None

    # The trained name and the job id both resolve to the trained policy.
    for name in (f"{base}:v1", job["id"]):
        backend = await asyncio.to_thread(resolve_backend, name)
        assert isinstance(backend, TrainedBackend) and backend.policy_version == 1

    # A running actor serves it; a second job of the same name makes version 2, which the
    # same actor loads without a restart (its rollouts say which version produced them).
    first = await run_model(client, f"{base}:v1")
    assert {r["policyVersion"] for r in first["rollouts"]} == {1}
    assert first["model"] == f"{base}:v1"
    again = await client.create_training_job(
        base_model=base, method="sft", source_run_id=run["runId"], suffix="v1",
        hyperparams=SFT | {"seed": 1},
    )  # fmt: skip
    await wait_for_event(js, again["id"], "job.completed", limit_s=240)
    assert [e.payload["version"] for e in await policy_events(js)] == [1, 2]
    second = await run_model(client, f"{base}:v1")
    assert {r["policyVersion"] for r in second["rollouts"]} == {2}


async def test_dpo_job_trains_on_preference_pairs_of_a_run(
    client, agent_server, tiny_model: Path, learner_env, monkeypatch
) -> None:
    # Every trajectory goes to the object store: the learner follows the claim checks.
    monkeypatch.setenv("ROLLOUT_INLINE_TRAJECTORY_BYTES", "1")
    run = await scripted_run(client, agent_server, n=8, seed=7)
    rollouts = await client.get_rollouts(run["runId"], include_trajectories=False)
    assert all(r["trajectoryUri"] for r in rollouts)
    job = await client.create_training_job(
        base_model=f"hf:{tiny_model}", method="dpo", source_run_id=run["runId"], suffix="dpo",
        hyperparams={"max_steps": 2, "save_every": 2, "batch_size": 2, "min_margin": 0.5},
    )  # fmt: skip
    assert job["pairs"] > 0
    js = await client.jetstream()
    done = await wait_for_event(js, job["id"], "job.completed", limit_s=240)
    assert done.payload["metrics"]["steps"] == 2
    assert done.payload["metrics"]["examples"] == job["pairs"]
    events = await job_events(js, job["id"])
    progress = [e.payload for e in events if e.type == "job.progress"]
    assert [p["step"] for p in progress] == [1, 2]
    assert all(p["reward"] is not None for p in progress)  # DPO's reward margin
    [policy] = await policy_events(js)
    assert policy.payload["model"] == f"hf:{tiny_model}:dpo"
