"""`rollout serve-model` with the platform: a run's actors use it as their model, and a served
trained policy switches to each version `policy.updated` announces, with no failed request."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from conftest import build_tiny, client_of
from pipeline.kit import Platform, wait_for_platform
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.services.inference.app import KeyRing
from rollout.services.learner.artifacts import upload_dir
from rollout.shared.bus.publisher import EventPublisher
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import PolicyUpdated
from rollout.shared.envs.loader import load_environments
from rollout.shared.models import names, trained
from rollout.shared.settings import Settings, connect_nats

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def home(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """This process resolves trained models from the test's home and object store."""
    monkeypatch.setenv("ROLLOUT_HOME", str(settings.home))
    monkeypatch.delenv("ROLLOUT_OBJECT_STORE_URL", raising=False)
    return settings


async def test_a_run_uses_the_served_model_as_its_actor_model(
    serve, home: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    platform = Platform(home)
    for name in ("env-registry", "tracker", "verifier", "actor"):
        platform.start(name)
    client = AsyncClient(home, timeout_s=20)
    try:
        await wait_for_platform(client, platform)
        (env,) = load_environments(EXAMPLES / "refund_agent.py")
        await client.push_environment(env)
        # Exposed with a key: the operator's endpoint policy gives the actor that key.
        monkeypatch.setenv("SERVE_KEY", "sk-actor")
        async with serve("local/scripted", keys=KeyRing(["sk-actor"])) as running:
            monkeypatch.setenv(
                "ROLLOUT_MODEL_ENDPOINTS",
                json.dumps({"endpoints": {"served": {"url": running.base_url,
                                                     "key_env": "SERVE_KEY"}}}),
            )  # fmt: skip
            run = await client.create_run(
                "refund-agent", running.actor_model, n=2, split="train", temperature=0.0,
                max_tool_calls=6,
            )  # fmt: skip
            done = await client.wait_for_run(run["runId"], timeout_s=60)
            served = running.policy.slot.served
        assert done["status"] == "completed", done
        assert done["total"] == done["scored"] > 0
        # The scripted agent plays each task's ground-truth plan, one tool call per turn,
        # through the server: every rollout passes, and each turn was one served request.
        assert done["passed"] == done["total"], done
        full = await client.get_run(run["runId"], include_rollouts=True)
        assert full["model"] == running.actor_model
        assert served >= 2 * done["total"]
    finally:
        await client.close()
        platform.check()
        await platform.stop_all()


async def _publish(
    js, store, name: str, base: str, version: int, model_dir: Path
) -> trained.PolicyRecord:
    """What the learner does for a new version: checkpoint, record, then `policy.updated`."""
    ref = await upload_dir(store, model_dir, f"models/{trained.policy_key(name)}", arcname=".")
    record = trained.PolicyRecord(
        model=name, version=version, uri=ref.uri, sha256=ref.sha256, size=ref.size,
        base_model=base,
    )  # fmt: skip
    await trained.publish_record(store, record)
    update = PolicyUpdated(model=name, version=version, checkpoint_uri=ref.uri, sha256=ref.sha256)
    await EventPublisher(js).publish(
        EventEnvelope.new(update, aggregate_id=trained.policy_key(name), id_parts=(name, version))
    )
    return record


async def test_a_served_policy_switches_versions_without_failing_a_request(
    serve, home: Settings, tiny_model: Path, tmp_path: Path
) -> None:
    base = f"hf:{tiny_model}"
    name = names.trained_name(base, "live")
    second = build_tiny(tmp_path / "v2", seed=1)
    nc = await connect_nats(home)
    store = trained.default_store()
    try:
        js = nc.jetstream()
        await ensure_streams(js, 1)
        await _publish(js, store, name, base, 1, tiny_model)
        async with serve(name, follow=lambda: home) as running:
            client = client_of(running)
            card = await client.models.retrieve(name)
            assert card.policy_version == 1 and card.root == name
            prompt = [{"role": "user", "content": "Refund order O-1 in full"}]

            async def ask():
                return await client.chat.completions.create(
                    model=name, messages=prompt, max_tokens=4, temperature=0, logprobs=True
                )

            before = await ask()
            assert before.system_fingerprint == "policy-v1"
            seen: list[str] = []
            stop = asyncio.Event()

            async def hammer() -> None:
                # Clients keep asking through the switch; any failure raises out of here.
                while not stop.is_set():
                    answers = await asyncio.gather(*(ask() for _ in range(3)))
                    seen.extend(a.system_fingerprint for a in answers)

            traffic = asyncio.create_task(hammer())
            await wait_until(lambda: _true_after(seen, 3), "requests on version 1")
            await _publish(js, store, name, base, 2, second)

            async def on_v2() -> bool:
                assert not traffic.done() or traffic.exception() is None
                card = await client.models.retrieve(name)
                return card.policy_version == 2 and "policy-v2" in seen

            await wait_until(on_v2, "the server to serve version 2", limit_s=60)
            stop.set()
            await traffic  # raises if any request failed during the switch
            # Every answer came from one version, and once v2 answered, v1 never did again.
            assert set(seen) == {"policy-v1", "policy-v2"}
            first_v2 = seen.index("policy-v2")
            assert all(s == "policy-v2" for s in seen[first_v2:])
            after = await ask()
            assert after.system_fingerprint == "policy-v2"
            old_lp = [t.logprob for t in before.choices[0].logprobs.content]
            new_lp = [t.logprob for t in after.choices[0].logprobs.content]
            assert old_lp != new_lp  # other weights answer now
            # The old version's weights are dropped once its queued requests are done.
            [old] = running.policy._retired
            await wait_until(lambda: _done(old.worker), "the old version to be dropped")
            assert running.policy.switches == 1
    finally:
        await store.close()
        await nc.close()


async def _true_after(seen: list[str], count: int) -> bool:
    return len(seen) >= count


async def _done(task) -> bool:
    return task is not None and task.done()


async def test_a_follower_that_ignores_its_cancel_does_not_keep_the_server_from_stopping(
    serve, home: Settings, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A NATS request can swallow a cancel on Python 3.11 (shared/bus/cancels.py); whatever
    # follower is left running, the server still stops, after SHUTDOWN_WAIT_S.
    import rollout.services.inference.server as server_module

    release, started = asyncio.Event(), asyncio.Event()

    async def stubborn(policy, settings_for) -> None:  # type: ignore[no-untyped-def]
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    monkeypatch.setattr(server_module, "follow_updates", stubborn)
    monkeypatch.setattr(server_module, "SHUTDOWN_WAIT_S", 0.5)
    base = f"hf:{tiny_model}"
    name = names.trained_name(base, "stubborn")
    nc = await connect_nats(home)
    store = trained.default_store()
    try:
        js = nc.jetstream()
        await ensure_streams(js, 1)
        await _publish(js, store, name, base, 1, tiny_model)
        async with serve(name, follow=lambda: home) as running:
            follower = running.follower
            assert follower is not None
            await asyncio.wait_for(started.wait(), 30)
        # Out of the block within the limit, the follower still running.
        assert not follower.done()
    finally:
        release.set()
        await store.close()
        await nc.close()
