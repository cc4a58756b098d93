"""`rollout cancel JOB`: a training job stops at its next step and ends once, as cancelled;
an online job's round runs and a provider's fine-tune are cancelled with it; a job that ended
keeps its ending."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fake_finetune import FakeFineTuning
from learner_kit import (
    Platform,
    job_events,
    letters_env,
    ready_client,
    scripted_run,
    wait_for_event,
)
from pipeline.test_cli_platform import rollout
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.services.learner import providers
from rollout.services.learner.jobs import cancel_job, execute
from rollout.shared import subjects
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts import events as ev
from rollout.shared.contracts import new_id
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.requests import CancelTrainingJob
from rollout.shared.objectstore import open_store, put_json
from rollout.shared.service import durables
from rollout.shared.settings import Settings


async def job_let_go(js) -> bool:
    """The learner's job queue holds nothing, delivered or not: no worker is on a job."""
    info = await js.consumer_info(subjects.WORK_STREAM, durables.LEARNER_JOBS.name)
    return info.num_pending == 0 and info.num_ack_pending == 0


async def test_a_cancelled_sft_job_stops_training_and_ends_once(
    client, agent_server, tiny_model: Path, learner_env: Settings
) -> None:
    run = await scripted_run(client, agent_server, n=2, tasks=2)
    ids = await client.passing_rollout_ids(run["runId"])
    job = await client.create_training_job(
        base_model=f"hf:{tiny_model}", method="sft", source_run_id=run["runId"],
        rollout_ids=ids, suffix="stopped",
        # It would train for hours: only the cancel ends it.
        hyperparams={"max_steps": 100_000, "save_every": 100_000, "batch_size": 2},
    )  # fmt: skip
    js = await client.jetstream()
    await wait_for_event(js, job["id"], "job.progress", limit_s=240)
    # Its model does not exist yet: a run on it is refused before anything is queued.
    with pytest.raises(RolloutError, match=f"training job {job['id']} has published no model yet"):
        await client.create_run("refunds", job["id"])
    # The job is its creator's: a runner key that did not start it may not cancel it.
    events = await job_events(js, job["id"])
    owner = events[0].payload["owner"]
    assert owner == subjects.caller_token(learner_env.nats_user), owner
    with pytest.raises(RolloutError, match="a key may cancel only what it started"):
        cmd = CancelTrainingJob(job_id=job["id"], reason="not mine")
        await cancel_job(SimpleNamespace(js=js), cmd, caller="rk_runner_0123456789ab")
    ended = await client.cancel_training_job(job["id"], reason="enough")
    assert ended["status"] == "failed" and ended["reason"].startswith("cancelled: enough (at step")

    await wait_until(lambda: job_let_go(js), "the learner to stop the job and let it go", 120)
    events = await job_events(js, job["id"])
    types = [e.type for e in events]
    assert types.count("job.failed") == 1 and "job.completed" not in types, types
    assert events[types.index("job.failed")].payload["reason"] == ended["reason"]
    # The trainer stopped at its next report: at most a report already on its way follows.
    after = types[types.index("job.failed") + 1 :]
    assert after in ([], ["job.progress"]), after
    steps = [e.payload["step"] for e in events if e.type == "job.progress"]
    assert max(steps) < 100_000
    # Nothing was published as the trained model.
    policies = [
        EventEnvelope.from_bytes(m.data).payload
        async for m in read_events(js, subjects.aggregate_events("policy"))
    ]
    assert not [p for p in policies if p.get("job_id") == job["id"]], policies

    async def listed_failed() -> bool:
        # The read model follows the log a moment behind: read once, it may still say running.
        return (await client.get_training_job(job["id"]))["status"] == "failed"

    await wait_until(listed_failed, "the cancel in the jobs read model", 30)
    with pytest.raises(RolloutError, match="failed and published no model: cancelled: enough"):
        await client.create_run("refunds", job["id"])

    # Once ended, it cannot be cancelled again; an unknown job is named.
    again = await rollout(learner_env, "cancel", job["id"])
    assert again[0] == 1 and again[2].startswith(f"error: job {job['id']} already failed (cancel")
    # `rollout job` says cancelled, as `rollout jobs` lists it, with no ETA left to wait out.
    code, out, err = await rollout(learner_env, "job", job["id"])
    assert code == 1 and out.startswith(f"job {job['id']}  cancelled  sft of "), out
    assert "ETA" not in out and "reason: cancelled: enough (at step" in out, out
    try:
        await client.cancel_training_job("job-nosuchjob")
    except RolloutError as exc:
        assert str(exc).startswith("job_id: no training job 'job-nosuchjob'")
    else:
        raise AssertionError("cancelling an unknown job was accepted")


async def test_cancelling_an_online_job_cancels_the_round_it_waits_on(
    learner_env: Settings, tiny_model: Path
) -> None:
    # No actor: the job's first round never generates, so the job waits on it until cancelled.
    platform = Platform(learner_env)
    for name in ("env-registry", "tracker", "verifier", "buffer", "learner"):
        platform.start(name)
    client = await ready_client(learner_env, platform.check)
    try:
        await client.push_environment(letters_env(tasks=4))
        job = await client.create_training_job(
            base_model=f"hf:{tiny_model}", method="grpo", env_slug="letters", suffix="online",
            hyperparams={"max_steps": 5, "group_size": 2, "tasks_per_step": 1, "max_tokens": 6,
                         "max_tool_calls": 1},
        )  # fmt: skip

        async def rounds() -> list[dict]:
            return [r for r in await client.list_runs() if job["id"] in (r.get("name") or "")]

        await wait_until(rounds, "the job's first round run", 120)
        # The round runs are the job owner's, though the learner started them.
        js = await client.jetstream()
        first = (await rounds())[0]["runId"]
        requested = EventEnvelope.from_bytes(
            (await js.get_last_msg(subjects.EVENTS_STREAM, subjects.event(
                "run", first, "run_requested"))).data
        )  # fmt: skip
        job_owner = (await job_events(js, job["id"]))[0].payload["owner"]
        assert (
            requested.payload["owner"] == job_owner == subjects.caller_token(learner_env.nats_user)
        )

        # It is being worked on, though no step has ended: listed running, not queued (the
        # whole first round used to read `queued`).
        async def listed_running() -> bool:
            code, out, _ = await rollout(learner_env, "jobs")
            return [job["id"], "grpo", "running", "-"] in [r.split()[:4] for r in out.splitlines()]

        await wait_until(listed_running, "`rollout jobs` to list the job as running", 30)
        # Following it shows it started, though no step has been reported; it ends at the cancel.
        following = asyncio.create_task(rollout(learner_env, "job", job["id"], "--follow"))
        code, out, err = await rollout(learner_env, "cancel", job["id"], "--reason", "wrong env")
        assert code == 0, err
        code, followed, progress = await asyncio.wait_for(following, 60)
        assert code == 1 and followed.startswith(f"job {job['id']}  cancelled  grpo"), followed
        assert "started: loading the model and its data (online: the first round)" in progress
        assert out.startswith(f"job {job['id']} cancelled: wrong env (at step 0)"), out
        assert "a queued one never starts" in out, out

        async def listed_cancelled() -> bool:
            code, out, _ = await rollout(learner_env, "jobs")
            return any(line.split()[:3] == [job["id"], "grpo", "cancelled"]
                       for line in out.splitlines())  # fmt: skip

        await wait_until(listed_cancelled, "`rollout jobs` to list the job as cancelled", 30)

        js = await client.jetstream()
        await wait_until(lambda: job_let_go(js), "the learner to stop the job and let it go", 60)

        async def rounds_ended() -> bool:
            return all(r["status"] != "running" for r in await rounds())

        await wait_until(rounds_ended, "the job's round runs to end", 30)
        for r in await rounds():
            assert r["status"] == "failed", r
            full = await client.get_run(r["runId"])
            assert full["reason"].startswith(f"cancelled: its job {job['id']} ended"), full
        types = [e.type for e in await job_events(js, job["id"])]
        assert types.count("job.failed") == 1 and "job.progress" not in types, types
        platform.check()
    finally:
        await client.close()
        await platform.stop_all()


async def test_cancelling_a_provider_job_cancels_it_at_the_provider(
    client, agent_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A provider job that would run for ever: only the cancel ends it, here and there.
    with FakeFineTuning("openai", polls_until_done=10**9) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
        monkeypatch.setenv("ROLLOUT_PROVIDER_POLL_S", "0.05")
        run = await scripted_run(client, agent_server, n=2)
        ids = await client.passing_rollout_ids(run["runId"])
        job = await client.create_training_job(
            base_model="openai/gpt-4o-mini-2024-07-18", method="sft", source_run_id=run["runId"],
            rollout_ids=ids, suffix="never",
        )  # fmt: skip
        js = await client.jetstream()
        await wait_for_event(js, job["id"], "job.progress", limit_s=60)
        ended = await client.cancel_training_job(job["id"], reason="too dear")
        assert ended["reason"].startswith("cancelled: too dear")

        def cancelled_there() -> bool:
            return all(j.get("cancelled") for j in server.jobs.values())

        await wait_until(cancelled_there, "the provider's job to be cancelled", 30)
        assert len(server.jobs) == 1
    types = [e.type for e in await job_events(js, job["id"])]
    assert types.count("job.failed") == 1 and "job.completed" not in types, types


async def test_a_provider_job_cancelled_between_deliveries_is_cancelled_there(
    nats_client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel lands while no replica runs the job (a retry's backoff, a replica that died):
    the next delivery finds it ended and stops the provider's job too, once."""
    with FakeFineTuning("openai") as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
        js = nats_client.jetstream()
        await ensure_streams(js)
        store = open_store(tmp_path / "objects")
        job_id = f"job-{new_id()[:16]}"
        # What an earlier delivery made: the provider's job, and its id in the store.
        async with httpx.AsyncClient(
            base_url=server.base_url, headers={"Authorization": f"Bearer {server.api_key}"}
        ) as http:
            created = await http.post("/fine_tuning/jobs", json={"model": "gpt-4o-mini"})
        remote = created.json()["id"]
        await put_json(store, providers._state_key(job_id), {"provider": "openai", "job": remote})
        first = EventEnvelope.new(
            ev.JobRequested(job_id=job_id, method="sft", base_model="openai/gpt-4o-mini"),
            aggregate_id=job_id,
            id_parts=(job_id,),
        )
        await EventPublisher(js).publish(first)
        ctx = SimpleNamespace(js=js, store=store)  # what execute uses of the learner's context
        await cancel_job(ctx, CancelTrainingJob(job_id=job_id, reason="too dear"))
        assert not server.jobs[remote].get("cancelled")

        await execute(ctx, job_id)  # the next delivery
        assert server.jobs[remote].get("cancelled") is True
        server.jobs[remote]["cancelled"] = False
        await execute(ctx, job_id)  # told once
        assert server.jobs[remote]["cancelled"] is False
