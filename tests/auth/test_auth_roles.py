"""Keys map to NATS users with roles: what a viewer and a runner may do, refused fast and clearly."""

from __future__ import annotations

import asyncio
import time

import nats.errors
import pytest
from nats.js import api
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.auth.keys import ApiKey, KeyStore
from rollout.shared.auth.permissions import SERVICE_DURABLES
from rollout.shared.bus.reader import read_events
from rollout.shared.settings import Settings
from rollout.shared.stack.nats import NatsServer

from .conftest import refund_env

# A refused request must fail long before the Client's request timeout.
FAST_S = 3.0
MODEL = "http://127.0.0.1:9/v1#scripted"


def client_for(settings: Settings, key: ApiKey | None) -> AsyncClient:
    """A client of the auth server presenting `key`."""
    return AsyncClient(settings, api_key=key.text if key else None, timeout_s=20)


async def refused_fast(call: object) -> RolloutError:
    """Await `call`, expecting a RolloutError well before the request timeout."""
    started = time.monotonic()
    with pytest.raises(RolloutError) as caught:
        await call  # type: ignore[misc]
    assert time.monotonic() - started < FAST_S, "refused only after a timeout"
    return caught.value


async def test_viewer_may_query_and_follow_but_not_push_or_run(
    service_settings: Settings, services: None, viewer_key: ApiKey, runner_key: ApiKey
) -> None:
    runner = client_for(service_settings, runner_key)
    viewer = client_for(service_settings, viewer_key)
    try:
        await runner.push_environment(refund_env())

        assert [e["slug"] for e in await viewer.list_environments()] == ["refunds"]
        assert (await viewer.get_environment("refunds"))["slug"] == "refunds"
        assert await viewer.list_runs() == []
        assert await viewer.list_training_jobs() == []
        js = await viewer.jetstream()
        seen = [m.subject async for m in read_events(js, subjects.aggregate_events("env"))]
        assert seen and all(s.startswith("rollout.evt.env.refunds.") for s in seen)
        following = read_events(js, subjects.ALL_EVENTS, follow=True)
        first = await asyncio.wait_for(anext(following), 10)
        assert first.subject == seen[0]
        await following.aclose()

        denied = await refused_fast(viewer.push_environment(refund_env()))
        assert str(denied).startswith("permission denied: a viewer key cannot push environments")
        assert "runner" in str(denied)
        denied = await refused_fast(viewer.create_run("refunds", MODEL, n=1))
        assert denied.message == "permission denied: a viewer key cannot start runs"
        assert denied.problems and "needs a runner key" in denied.problems[0], denied.problems
        denied = await refused_fast(viewer.cancel_run("any-run"))
        assert denied.message == "permission denied: a viewer key cannot cancel runs"
        denied = await refused_fast(viewer.create_training_job("base", "sft", source_run_id="r"))
        assert denied.message == "permission denied: a viewer key cannot create training jobs"
        # The connection survives a refusal: the next permitted query still works.
        assert len(await viewer.list_environments()) == 1
    finally:
        await runner.close()
        await viewer.close()


async def test_runner_may_push_and_run(
    service_settings: Settings, services: None, runner_key: ApiKey
) -> None:
    runner = client_for(service_settings, runner_key)
    try:
        pushed = await runner.push_environment(refund_env())
        assert pushed
        run = await runner.create_run("refunds", MODEL, n=1)
        # The read model follows the run's events within moments.

        async def listed() -> bool:
            return any(r["runId"] == run["runId"] for r in await runner.list_runs())

        await wait_until(listed, "the run to show up in `runs`", 30)
    finally:
        await runner.close()


async def test_a_key_cannot_touch_the_services_consumers_or_write_events(
    service_settings: Settings, services: None, viewer_key: ApiKey
) -> None:
    viewer = client_for(service_settings, viewer_key)
    try:
        js = await viewer.jetstream()
        # Refused publishes are dropped by the server: the JetStream call times out.
        with pytest.raises(nats.errors.TimeoutError):
            recreated = api.ConsumerConfig(
                name="tracker-read-models", durable_name="tracker-read-models", max_deliver=1
            )
            await js.add_consumer(subjects.EVENTS_STREAM, recreated, timeout=1)
        with pytest.raises(nats.errors.TimeoutError):
            sub = await js.pull_subscribe_bind("tracker-read-models", subjects.EVENTS_STREAM)
            await sub.fetch(1, timeout=1)
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish(subjects.event("env", "refunds", "env_registered"), b"{}", timeout=1)
        # It may look at a read-model projector's position (how stale what it reads may be:
        # `rollout status`, the viewer's banner), untouched (as the tracker made it)...
        info = await js.consumer_info(subjects.EVENTS_STREAM, "tracker-read-models", timeout=5)
        assert info.config.max_deliver == -1
        # ... and at no other service's consumer.
        with pytest.raises(nats.errors.TimeoutError):
            await js.consumer_info(subjects.EVENTS_STREAM, "verifier", timeout=1)
    finally:
        await viewer.close()


async def test_no_key_or_a_wrong_key_is_refused(
    service_settings: Settings, auth_nats: NatsServer, viewer_key: ApiKey
) -> None:
    anonymous = Settings(home=service_settings.home, nats_url=auth_nats.url, database_url=None)
    with pytest.raises(RolloutError, match="refused the connection"):
        await AsyncClient(anonymous).list_environments()

    forged = ApiKey(role=viewer_key.role, key_id=viewer_key.key_id, secret="0" * 48)
    with pytest.raises(RolloutError, match="refused API key rk_viewer_") as caught:
        await client_for(service_settings, forged).list_environments()
    assert forged.secret not in str(caught.value)

    # Claiming a higher role in the key names a user that does not exist.
    promoted = ApiKey.parse(viewer_key.text.replace("rk_viewer_", "rk_runner_"))
    with pytest.raises(RolloutError, match="refused API key rk_runner_"):
        await client_for(service_settings, promoted).list_environments()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sk-abc", "API keys start with 'rk_'"),
        ("rk_runner_short", "is malformed"),
        ("rk_admin_0123456789ab_" + "0" * 48, "unknown role 'admin'"),
    ],
)
def test_malformed_keys_are_refused_before_connecting(
    service_settings: Settings, text: str, message: str
) -> None:
    with pytest.raises(RolloutError, match=message) as caught:
        AsyncClient(service_settings, api_key=text)
    assert "0" * 48 not in str(caught.value)


async def test_revoked_key_is_refused_after_reload(
    service_settings: Settings, services: None, auth_nats: NatsServer, viewer_key: ApiKey
) -> None:
    viewer = client_for(service_settings, viewer_key)
    try:
        assert await viewer.list_environments() == []
        KeyStore(auth_nats.home).revoke(viewer_key.key_id)
        auth_nats.reload()
        # The open connection is dropped and cannot come back; a new one is refused.
        with pytest.raises(RolloutError):
            await viewer.list_environments()
        with pytest.raises(RolloutError, match="refused API key"):
            await client_for(service_settings, viewer_key).list_environments()
    finally:
        await viewer.close()


def test_service_durables_on_the_events_stream_are_all_protected() -> None:
    """Every declared durable is denied to keys (see permissions.SERVICE_DURABLES), and no service
    names a durable of its own outside the declarations (shared/service/durables.py)."""
    import re
    from pathlib import Path

    from rollout.shared.service import durables
    from rollout.shared.service.consumer import Consumer

    declared = {c.name for c in vars(durables).values() if isinstance(c, Consumer)}
    assert declared, "found no durable consumer declarations"
    assert declared <= set(SERVICE_DURABLES)
    services = Path(__file__).resolve().parents[2] / "services"
    for path in services.rglob("*.py"):
        text = path.read_text()
        assert not re.findall(r'^\w*DURABLE\w* = "([^"]+)"', text, re.M), path
        assert "durable=" not in text, f"{path} subscribes to a durable it did not declare"


def test_every_request_verb_has_a_role() -> None:
    """A verb a service answers is a query, a mutation or internal, never forgotten."""
    import importlib
    import re
    from pathlib import Path

    from rollout.shared.auth.roles import INTERNAL, MUTATIONS, QUERIES

    root = Path(__file__).resolve().parents[2]
    found = set()
    for path in (root / "services").rglob("*.py"):
        text = path.read_text()
        # What it calls, and what it answers (a route per verb).
        calls = re.findall(r'subjects\.request\(\s*([^,]+),\s*"([^"]+)"\)', text)
        calls += re.findall(r'service_subject\(\s*[^,]+,\s*([^,]+),\s*"([^"]+)"\)', text)
        calls += re.findall(r'request_route\(\s*\w+,\s*([^,]+),\s*"([^"]+)"', text)
        for name, verb in calls:
            name = name.strip()
            if not name.startswith('"'):
                # A constant: read its value from the module itself.
                module = ".".join(("rollout", *path.relative_to(root).with_suffix("").parts))
                name = getattr(importlib.import_module(module), name)
            found.add((name.strip('"'), verb))
    assert found, "found no request subjects under services/"
    assert found <= set(QUERIES) | set(MUTATIONS) | set(INTERNAL)
    # No key's role reaches a service's internal request.
    assert not set(INTERNAL) & (set(QUERIES) | set(MUTATIONS))
