"""A trained model's name belongs to the key whose job first published it: a colleague's key
training with the same base and suffix is refused, so it cannot replace the weights that the
owner's runs, compares and `serve-model` pick up by that name."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from auth.conftest import make_key
from auth.test_auth_roles import client_for
from fakes.openai_server import FakeOpenAI
from pipeline.kit import refund_agent, refund_env
from waiting import wait_until

from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.auth.keys import ApiKey
from rollout.shared.auth.roles import Role
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.models.trained import latest_record
from rollout.shared.objectstore import open_store
from rollout.shared.objectstore.factory import default_store_url
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import NatsServer

SFT = {"max_steps": 1, "save_every": 1, "batch_size": 2}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """An untrained tiny Llama to fine-tune."""
    from rollout.shared.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path / "tiny", corpus=["Refund order O-1", "refunded"], seed=0)


@pytest.fixture
def keys(auth_nats: NatsServer) -> tuple[ApiKey, ApiKey]:
    """Two runner keys, minted before the services connect (a reload may drop a connect)."""
    return make_key(auth_nats, Role.RUNNER), make_key(auth_nats, Role.RUNNER)


@pytest.fixture
async def learning(
    keys: tuple[ApiKey, ApiKey],
    service_settings: Settings,
    services: None,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[None]:
    """The actor, verifier, buffer and learner too, on the test's home and object store."""
    monkeypatch.setenv("ROLLOUT_HOME", str(service_settings.home))
    monkeypatch.delenv("ROLLOUT_OBJECT_STORE_URL", raising=False)
    monkeypatch.setenv("ROLLOUT_HF_THREADS", "1")
    tasks = [
        asyncio.create_task(
            importlib.import_module(f"rollout.services.{m}.main").serve(service_settings)
        )
        for m in ("actor", "verifier", "buffer", "learner")
    ]
    yield
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
def agent() -> Iterator[FakeOpenAI]:
    """The scripted refund agent over real HTTP."""
    with FakeOpenAI(refund_agent) as server:
        yield server


async def finished(js, job_id: str) -> EventEnvelope:
    """The job's ending event, once it has one."""
    async for msg in read_events(js, subjects.aggregate_events("job", job_id), follow=True):
        event = EventEnvelope.from_bytes(msg.data)
        if event.type in ("job.completed", "job.failed"):
            return event
    raise AssertionError("event stream ended")


async def test_a_colleague_cannot_publish_over_a_trained_name(
    service_settings: Settings, keys: tuple[ApiKey, ApiKey], learning: None, agent, tiny: Path
) -> None:
    alice, bob = (client_for(service_settings, key) for key in keys)
    try:
        await alice.push_environment(refund_env())

        async def run_completed() -> dict | None:
            try:
                run = await alice.create_run(
                    "refunds", f"{agent.base_url}#scripted", n=2, split="train", seed=1,
                    client_request_id="alice-run",
                )  # fmt: skip
            except Exception:  # noqa: BLE001 - the actors may not answer yet
                return None
            return run

        run = await wait_until(run_completed, "a run to be accepted", 60)
        done = await alice.wait_for_run(run["runId"], timeout_s=120)
        assert done["status"] == "completed", done
        base = f"hf:{tiny}"
        job = await alice.create_training_job(
            base_model=base, method="sft", source_run_id=run["runId"], suffix="v1",
            hyperparams=SFT,
        )  # fmt: skip
        js = await alice.jetstream()
        ended = await asyncio.wait_for(finished(js, job["id"]), 240)
        assert ended.type == "job.completed", ended.payload
        store = open_store(default_store_url(service_settings.home))
        assert (await latest_record(store, f"{base}:v1")).job_id == job["id"]

        # Bob's same base and suffix is refused at once, in words; the name stays alice's.
        with pytest.raises(RolloutError) as denied:
            await bob.create_training_job(
                base_model=base, method="sft", source_run_id=run["runId"], suffix="v1",
                hyperparams=SFT,
            )  # fmt: skip
        assert str(denied.value).startswith(
            f"suffix: model '{base}:v1' was trained by key {keys[0].key_id} (job {job['id']}), "
            f"not by key {keys[1].key_id}: a key may publish new versions only of its own"
        ), denied.value
        # Another suffix is his; alice may still publish a new version of her own name.
        again = await alice.create_training_job(
            base_model=base, method="sft", source_run_id=run["runId"], suffix="v1",
            hyperparams=SFT,
        )  # fmt: skip
        ended = await asyncio.wait_for(finished(js, again["id"]), 240)
        assert ended.type == "job.completed", ended.payload
        record = await latest_record(store, f"{base}:v1")
        assert (record.job_id, record.version) == (again["id"], 2)

        # Both queued before either published: whichever publishes first keeps the name, and
        # the other job fails at its publish, saying why, without replacing a version.
        jobs = [
            await who.create_training_job(
                base_model=base,
                method="sft",
                source_run_id=run["runId"],
                suffix="race",
                hyperparams=SFT,
            )  # fmt: skip
            for who in (alice, bob)
        ]
        endings = [await asyncio.wait_for(finished(js, j["id"]), 240) for j in jobs]
        assert sorted(e.type for e in endings) == ["job.completed", "job.failed"], endings
        [won] = [j["id"] for j, e in zip(jobs, endings, strict=True) if e.type == "job.completed"]
        [lost] = [e for e in endings if e.type == "job.failed"]
        assert lost.payload["reason"].startswith(f"suffix: model '{base}:race' was trained by")
        record = await latest_record(store, f"{base}:race")
        assert (record.job_id, record.version) == (won, 1)
    finally:
        await alice.close()
        await bob.close()
