"""Provider fine-tunes: the run's data is uploaded in the provider's format, the job tracked."""

from __future__ import annotations

import pytest
from fake_finetune import FakeFineTuning
from learner_kit import job_events, refund_agent, scripted_run, wait_for_event

pytestmark = pytest.mark.slow


def _chat(body: dict) -> dict:
    return refund_agent(body).body


@pytest.fixture
def openai_ft(monkeypatch: pytest.MonkeyPatch):
    """A fake OpenAI (files, fine-tuning jobs, chat) that the learner and actors talk to."""
    with FakeFineTuning("openai", chat=_chat) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
        monkeypatch.setenv("ROLLOUT_PROVIDER_POLL_S", "0.05")
        yield server


@pytest.fixture
def together_ft(monkeypatch: pytest.MonkeyPatch):
    """A fake Together fine-tuning API."""
    with FakeFineTuning("together") as server:
        monkeypatch.setenv("TOGETHER_BASE_URL", server.base_url)
        monkeypatch.setenv("TOGETHER_API_KEY", server.api_key)
        monkeypatch.setenv("ROLLOUT_PROVIDER_POLL_S", "0.05")
        yield server


async def test_openai_sft_uploads_chat_rows_with_tools_and_tracks_the_job(
    client, agent_server, openai_ft: FakeFineTuning
) -> None:
    run = await scripted_run(client, agent_server, n=2)
    ids = await client.passing_rollout_ids(run["runId"])
    base = "openai/gpt-4o-mini-2024-07-18"
    job = await client.create_training_job(
        base_model=base, method="sft", source_run_id=run["runId"], rollout_ids=ids,
        suffix="v1", hyperparams={"epochs": 2},
    )  # fmt: skip
    js = await client.jetstream()
    done = await wait_for_event(js, job["id"], "job.completed", limit_s=60)
    assert done.payload["model_id"] == f"{base}:v1"

    [upload] = openai_ft.uploads
    assert upload.path == "/v1/files" and upload.fields == {"purpose": "fine-tune"}
    rows = upload.rows()
    assert len(rows) == len(ids)
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        [call] = row["messages"][2]["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == "refund"
        assert isinstance(call["function"]["arguments"], str)  # JSON text, as OpenAI wants
        assert row["messages"][3]["tool_call_id"] == call["id"]
        assert {t["function"]["name"] for t in row["tools"]} == {"lookup_order", "refund"}
    [created] = openai_ft.jobs.values()
    assert created["body"]["model"] == "gpt-4o-mini-2024-07-18"
    assert created["body"]["suffix"] == "v1"
    assert created["body"]["method"]["supervised"]["hyperparameters"] == {"n_epochs": 2}
    assert openai_ft.unauthorized == 0
    events = await job_events(js, job["id"])
    assert any(e.type == "job.progress" for e in events)

    # The trained name runs through the provider's fine-tuned model.
    trained = await client.create_run("refunds", f"{base}:v1", n=1, split="train")
    finished = await client.wait_for_run(trained["runId"], timeout_s=60)
    assert finished["status"] == "completed" and finished["scored"] == 2
    # The scripted agent refunds one too much when its seed is divisible by 4.
    for r in await client.get_rollouts(trained["runId"], False):
        assert r["passed"] == (r["seed"] % 4 != 0), r
    assert {b["model"] for b in openai_ft.chat_bodies} == {
        f"ft:gpt-4o-mini-2024-07-18:acme:v1:{next(iter(openai_ft.jobs))}"
    }


async def test_together_dpo_uploads_preference_rows(
    client, agent_server, together_ft: FakeFineTuning
) -> None:
    run = await scripted_run(client, agent_server, n=8, seed=7)
    full = await client.get_run(run["runId"])
    assert any(0 < t["passed"] < t["n"] for t in full["tasks"]), "need mixed verdicts"
    base = "together/meta-llama/Llama-3.3-70B-Instruct-Reference"
    job = await client.create_training_job(
        base_model=base, method="dpo", source_run_id=run["runId"],
        hyperparams={"beta": 0.2, "lora": True},
    )  # fmt: skip
    js = await client.jetstream()
    done = await wait_for_event(js, job["id"], "job.completed", limit_s=60)
    assert done.payload["model_id"] == f"{base}:{job['id']}"
    [upload] = together_ft.uploads
    assert upload.path == "/v1/files/upload"
    assert upload.fields == {"purpose": "fine-tune", "file_name": upload.filename}
    rows = upload.rows()
    assert rows and len(rows) == job["pairs"]
    for row in rows:
        assert [m["role"] for m in row["input"]["messages"]] == ["system", "user"]
        [good], [bad] = row["preferred_output"], row["non_preferred_output"]
        assert good["role"] == bad["role"] == "assistant"
        assert good["tool_calls"] != bad["tool_calls"]
    [created] = together_ft.jobs.values()
    body = created["body"]
    assert body["model"] == "meta-llama/Llama-3.3-70B-Instruct-Reference"
    assert body["training_method"] == {"method": "dpo", "dpo_beta": 0.2}
    assert body["lora"] is True
