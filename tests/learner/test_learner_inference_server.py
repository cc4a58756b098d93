"""GRPO with the actor pool generating through an operator-run inference server.

The server is tests/fakes/vllm_server.py (vLLM's adapter-loading and completions API over
real HTTP, a real model and real peft adapters; vLLM itself needs a GPU). The actor loads
every policy version into it as a LoRA adapter, every rollout records the digest of the
weights that generated it, and the learner trains only on rollouts whose digest is that of
the version they claim.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.vllm_server import FakeVLLM, serving
from learner_kit import letters_env, wait_for_event
from waiting import wait_until

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.models.inference_server import ADAPTER_DIR_ENV, SERVER_ENV
from rollout.shared.models.local_models import base_ref_of

pytestmark = pytest.mark.slow

HYPERPARAMS = {"max_steps": 2, "group_size": 3, "max_staleness": 0, "tasks_per_step": 2,
               "max_tokens": 10, "max_tool_calls": 1, "learning_rate": 1e-3, "lora": True}  # fmt: skip


def _point_actors_at(server: FakeVLLM, tiny_model: Path, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(SERVER_ENV, f"{server.base_url}#{base_ref_of(tiny_model)}")
    monkeypatch.setenv(ADAPTER_DIR_ENV, str(tmp_path / "adapters"))


async def _grpo_through(
    server: FakeVLLM,
    ending: str,
    client,
    tiny_model: Path,
    monkeypatch,
    tmp_path: Path,
    loads: int,
) -> tuple[dict, object, EventEnvelope]:
    """A GRPO job whose actors generate through `server`, followed to `ending` and until the
    server has been asked to load `loads` adapters (the last version loads after the end)."""
    with serving(server):
        _point_actors_at(server, tiny_model, monkeypatch, tmp_path)
        await client.push_environment(letters_env())
        job = await client.create_training_job(
            base_model=f"hf:{tiny_model}", method="grpo", env_slug="letters",
            suffix="stale" if server.stale else "srv", hyperparams=HYPERPARAMS,
        )  # fmt: skip
        js = await client.jetstream()
        ended = await wait_for_event(js, job["id"], ending, limit_s=300)
        await wait_until(lambda: len(server.loads) >= loads and len(server.unloads) >= loads - 2,
                         f"{loads} adapter loads", limit_s=60)  # fmt: skip
        return job, js, ended


async def _policies(js) -> dict[int, str]:
    return {
        p["version"]: p["weights_sha256"]
        async for p in (
            EventEnvelope.from_bytes(m.data).payload
            async for m in read_events(js, subjects.aggregate_events("policy"))
        )
    }


async def test_grpo_trains_on_rollouts_the_server_generated_with_proven_weights(
    client, tiny_model: Path, learner_env, monkeypatch, tmp_path: Path
) -> None:
    server = FakeVLLM(tiny_model)
    job, js, done = await _grpo_through(server, "job.completed", client, tiny_model,
                                        monkeypatch, tmp_path, loads=3)  # fmt: skip
    digests = await _policies(js)
    assert sorted(digests) == [0, 1, 2] and len(set(digests.values())) == 3
    # Each version went to the server once, under its own name, with its digest; the oldest
    # was unloaded once two newer ones were in.
    loaded = [load["lora_name"] for load in server.loads]
    assert [n.split("-v")[-1].split("-")[0] for n in loaded] == ["0", "1", "2"]
    assert [load["rollout_weights_sha256"] for load in server.loads] == [
        digests[v] for v in (0, 1, 2)
    ]
    assert server.unloads == loaded[:1]
    # Every generation went to the server, as token ids, on the adapter of its version.
    assert server.completions and all(isinstance(c["prompt"], list) for c in server.completions)
    runs = [r for r in await client.list_runs(50) if r["model"] == job["model"]]
    seen = 0
    for run in runs:
        full = await client.get_run(run["runId"], include_rollouts=True, include_trajectories=True)
        for r in full["rollouts"]:
            assert r["trajectory"]["weights_sha256"] == digests[r["policyVersion"]]
            seen += 1
    assert seen >= 2 * HYPERPARAMS["group_size"] * HYPERPARAMS["tasks_per_step"]
    assert done.payload["metrics"]["weights_refused"] == 0


async def test_rollouts_from_a_server_still_serving_the_old_adapter_are_refused(
    client, tiny_model: Path, learner_env, monkeypatch, tmp_path: Path
) -> None:
    server = FakeVLLM(tiny_model, stale=True)
    job, js, failed = await _grpo_through(server, "job.failed", client, tiny_model,
                                          monkeypatch, tmp_path, loads=2)  # fmt: skip
    # Version 1 was "loaded" but version 0 kept answering: every v1 rollout carries v0's
    # digest, the learner trains on none of them, and the job says why it stopped.
    digests = await _policies(js)
    assert sorted(digests) == [0, 1]
    reason = failed.payload["reason"]
    assert "refused for weights that are not those of the version they claim" in reason
    runs = [r for r in await client.list_runs(50) if r["model"] == job["model"]]
    claimed_v1 = [
        r
        for run in runs
        for r in (
            await client.get_run(run["runId"], include_rollouts=True, include_trajectories=True)
        )["rollouts"]
        if r["policyVersion"] == 1
    ]
    assert claimed_v1
    assert {r["trajectory"]["weights_sha256"] for r in claimed_v1} == {digests[0]}
