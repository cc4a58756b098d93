"""Online GRPO through the platform: the learner drives actor runs and publishes versions."""

from __future__ import annotations

from pathlib import Path

import pytest
from learner_kit import job_events, letters_env, wait_for_event

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.objectstore import open_store
from rollout.shared.objectstore.claimcheck import get_json
from rollout.shared.objectstore.factory import default_store_url

pytestmark = pytest.mark.slow


async def test_grpo_job_drives_actors_and_publishes_each_version(
    client, tiny_model: Path, learner_env
) -> None:
    await client.push_environment(letters_env())
    base = f"hf:{tiny_model}"
    job = await client.create_training_job(
        base_model=base, method="grpo", env_slug="letters", suffix="rl",
        hyperparams={"max_steps": 2, "group_size": 3, "max_staleness": 1, "tasks_per_step": 2,
                     "max_tokens": 12, "max_tool_calls": 1, "learning_rate": 1e-3},
    )  # fmt: skip
    model = f"{base}:rl"
    assert job["model"] == model
    js = await client.jetstream()
    done = await wait_for_event(js, job["id"], "job.completed", limit_s=300)
    assert done.payload["model_id"] == model

    policies = [
        EventEnvelope.from_bytes(m.data).payload
        async for m in read_events(js, subjects.aggregate_events("policy"))
    ]
    assert [(p["model"], p["version"]) for p in policies] == [(model, 0), (model, 1), (model, 2)]
    # Each trained version says how far the actors' logprobs were from the learner's. Same
    # numerics on both sides here: on fresh samples the gap is noise; a sample of the previous
    # version (max_staleness 1) shows it, still small after one low-rate step.
    assert policies[0].get("off_policy") is None  # the starting version: no step made it
    for p in policies[1:]:
        gap = p["off_policy"]
        assert 0.0 <= gap["staleness"] <= 1.0 and gap["max_is_ratio"] >= 1.0, gap
        limit = 1e-3 if gap["staleness"] == 0 else 0.05
        assert 0.0 <= gap["mismatch_kl"] < limit and gap["is_outside_fraction"] < 0.05, gap
    events = await job_events(js, job["id"])
    assert [e.payload["step"] for e in events if e.type == "job.progress"] == [1, 2]
    metrics = done.payload["metrics"]
    assert metrics["runs"] >= 2 and 0.0 <= metrics["wait_share"] <= 1.0

    # The learner's runs are ordinary runs of the trained name on the train split, and every
    # rollout says which policy version produced it.
    runs = [r for r in await client.list_runs(50) if r["model"] == model]
    assert len(runs) == metrics["runs"]
    tokens = {}
    for run in runs:
        assert run["split"] == "train"
        full = await client.get_run(run["runId"], include_rollouts=True, include_trajectories=True)
        assert {r["policyVersion"] for r in full["rollouts"]} <= {0, 1, 2}
        for r in full["rollouts"]:
            tokens[r["rolloutId"]] = [len(t) for t in r["trajectory"].get("token_ids") or []]

    # Each trained version points at what its step did with every token of the rollouts it
    # trained on, stored by content hash: per turn as many values as the actor sampled.
    store = open_store(default_store_url(learner_env.home))
    try:
        for p in policies[1:]:
            assert p["trained_rollouts"] and p["signals_uri"], p
            doc = await get_json(store, p["signals_uri"], sha256=p["signals_sha256"])
            assert sorted(doc["rollouts"]) == sorted(p["trained_rollouts"])
            for rollout_id, turns in doc["rollouts"].items():
                for turn, got in turns.items():
                    n = tokens[rollout_id][int(turn)]
                    assert len(got["advantage"]) == len(got["ratio"]) == len(got["clipped"]) == n
    finally:
        await store.close()


def test_completions_older_than_max_staleness_are_not_trained_on(
    tiny_model: Path, tmp_path: Path
) -> None:
    from rollout.services.learner.online_jobs import trainable
    from rollout.shared.learning import GRPOLearner, TrainConfig

    config = TrainConfig(method="grpo", max_steps=5, max_staleness=1, group_size=2)
    learner = GRPOLearner(tiny_model, tmp_path / "out", config, resume=False)
    learner.policy_version = 3  # as if three steps had been taken
    completions = [
        {"rollout_id": f"r{v}", "reward": float(v), "policy_version": v, "token_ids": [[1]]}
        for v in range(4)
    ]
    kept = trainable([{"prompt": [], "completions": completions}], learner.accepts, {}, 2)
    assert [c["policy_version"] for c in kept.groups[0]["completions"]] == [2, 3]
    assert (kept.stale, kept.refused) == (2, [])


async def test_a_version_pushed_mid_job_does_not_change_what_the_job_learns_from(
    client, tiny_model: Path, learner_env
) -> None:
    """Whoever pushes a new version of the env (say with a verifier that passes everything)
    while a GRPO job runs, every round of the job still runs on the version it started on."""
    await client.push_environment(letters_env())
    job = await client.create_training_job(
        base_model=f"hf:{tiny_model}", method="grpo", env_slug="letters", suffix="pinned",
        hyperparams={"max_steps": 3, "group_size": 2, "max_staleness": 0, "tasks_per_step": 1,
                     "max_tokens": 8, "max_tool_calls": 1},
    )  # fmt: skip
    js = await client.jetstream()
    await wait_for_event(js, job["id"], "job.progress", limit_s=300)
    lenient = letters_env()
    lenient["verifier"] = {
        "primitives": [{"name": "anything", "type": "contains_terms", "terms": [""]}]
    }
    assert (await client.push_environment(lenient))["version"] == 2
    done = await wait_for_event(js, job["id"], "job.completed", limit_s=300)
    runs = [r for r in await client.list_runs(50) if r["model"] == done.payload["model_id"]]
    assert len(runs) == done.payload["metrics"]["runs"] >= 3
    assert {r["envVersion"] for r in runs} == {1}, runs
