"""The learner's training data comes from the buffer: complete, verified, and never a hang."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from learner_kit import (
    Platform,
    all_job_events,
    letters_env,
    ready_client,
    scripted_run,
    wait_for_event,
)

from rollout.errors import RolloutError
from rollout.services.learner import training_sets
from rollout.shared.aggregates.run import load_run_head
from rollout.shared.contracts.buffer import SftSetQuery
from rollout.shared.learning.data import sft_examples
from rollout.shared.learning.trainer_rows import sft_rows
from rollout.shared.objectstore import open_store
from rollout.shared.objectstore.factory import default_store_url
from rollout.shared.settings import connect_nats

WITHOUT_BUFFER = ("env-registry", "tracker", "verifier", "actor", "learner")


def messages_of(rows: list[dict]) -> list[list[dict]]:
    """The conversations of SFT rows (tools aside)."""
    return [row["messages"] for row in rows]


async def test_without_the_buffer_jobs_say_so_at_once_and_nothing_hangs(
    learner_env, agent_server, tiny_model: Path, monkeypatch
) -> None:
    monkeypatch.setenv("ROLLOUT_LEARNER_MAX_DELIVER", "1")
    platform = Platform(learner_env)
    for name in WITHOUT_BUFFER:
        platform.start(name)
    client = await ready_client(learner_env, platform.check)
    base = f"hf:{tiny_model}"
    try:
        run = await scripted_run(client, agent_server, n=2)
        loop = asyncio.get_running_loop()
        asked = loop.time()
        with pytest.raises(RolloutError) as refused:
            await client.create_training_job(
                base_model=base, method="sft", source_run_id=run["runId"]
            )
        assert loop.time() - asked < 10, "the learner waited for a buffer that is not there"
        assert "the buffer service is not running" in str(refused.value)
        assert "rollout serve buffer" in str(refused.value)
        js = await client.jetstream()
        assert await all_job_events(js) == []  # nothing half-created

        # A GRPO job needs the buffer once its first run has ended: it fails with the reason.
        await client.push_environment(letters_env())
        job = await client.create_training_job(
            base_model=base, method="grpo", env_slug="letters",
            hyperparams={"max_steps": 2, "group_size": 2, "tasks_per_step": 1, "max_tokens": 8},
        )  # fmt: skip
        failed = await wait_for_event(js, job["id"], "job.failed", limit_s=120)
        assert "the buffer service is not running" in failed.payload["reason"]
    finally:
        await client.close()
        await platform.stop_all()


async def test_sft_rows_from_the_buffer_are_the_runs_whole_verified_trajectories(
    learner_env, agent_server, tiny_model: Path, monkeypatch
) -> None:
    # Every trajectory goes to the object store: the buffer keeps only URI + sha256.
    monkeypatch.setenv("ROLLOUT_BUFFER_INLINE_BYTES", "0")
    platform = Platform(learner_env)
    for name in (*WITHOUT_BUFFER, "buffer"):
        platform.start(name)
    client = await ready_client(learner_env, platform.check)
    nc = await connect_nats(learner_env)
    store = open_store(default_store_url(learner_env.home))
    try:
        run = await scripted_run(client, agent_server, n=4)
        full = await client.get_run(run["runId"], include_rollouts=True, include_trajectories=True)
        expected = [
            {"trajectory": r["trajectory"], "tools": None}
            for r in sorted(full["rollouts"], key=lambda r: (r["taskIndex"], r["sampleIndex"]))
            if r["passed"]
        ]
        info = await load_run_head(nc.jetstream(), run["runId"])
        assert info is not None and info.status == "completed" and info.ended_seq > 0
        found = await training_sets.sft_set(nc, store, run["runId"], None, after_seq=info.ended_seq)
        assert len(found.items) == len(expected) == run["passed"]
        # The buffer's conversations are the run's trajectories, turn for turn.
        assert messages_of(sft_rows(found.items)) == messages_of(sft_examples(expected))
        assert all(e["tools"] for e in found.items)  # the tools the task offered
        # An answer too large for a message comes back as a claim check, verified on load.
        small = SftSetQuery(run_id=run["runId"], inline_limit=1024, after_seq=info.ended_seq)
        as_ref = await training_sets.ask(nc, store, "sft_set", small)
        assert as_ref.items == found.items and as_ref.meta == found.meta

        # A trajectory blob (stored once, by the actor) changed behind the platform's back is
        # refused by its sha256.
        [blob] = [k for k in await store.list("trajectories/")][:1]
        await store.put(blob, b'{"messages": []}', overwrite=True)
        with pytest.raises(RolloutError, match="is corrupted"):
            await client.create_training_job(
                base_model=f"hf:{tiny_model}", method="sft", source_run_id=run["runId"]
            )
    finally:
        await store.close()
        await nc.close()
        await client.close()
        await platform.stop_all()
