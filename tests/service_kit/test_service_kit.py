"""The service kit: a new service in a handful of lines, and consumers that cannot drift.

A tiny service (tiny_service.py: one work consumer, one request handler, Postgres) runs
through `rollout serve`'s own entry with the kit's bootstrap against the real nats-server and
Postgres, and must consume, answer and beat. The declared consumers of every platform service
are checked against the server-side consumers the bootstrap creates and the permissions its
role is granted: one declaration, three uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from service_kit import tiny_service
from service_kit.tiny_service import GREETINGS, CountGreetings, Greeting
from waiting import wait_until

from rollout.cli import main as cli_main
from rollout.services.catalog import asyncapi_brokers
from rollout.shared import subjects
from rollout.shared.auth.services import SERVICE_ROLES, service_permissions
from rollout.shared.bus.requests import call
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.errors import RolloutError
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, ensure_consumers, serve_service
from rollout.shared.service.consumer import Consumer
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.health import read_beat
from rollout.shared.stack.serve import run_service
from rollout.shared.stack.services import EXTRA_ENV
from rollout.shared.stack.status import collect_status

DEADLINE_S = 20.0


async def _until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Poll `check` until it returns something truthy, within the deadline."""
    return await wait_until(check, what, DEADLINE_S)


async def test_a_tiny_kit_service_consumes_answers_and_beats(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EXTRA_ENV, "tiny=service_kit.tiny_service")
    task = asyncio.create_task(run_service("tiny", settings, replica_id="tiny-1", interval=0.2))
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()

        async def counted() -> int | None:
            if task.done():
                task.result()  # a crashed service fails here with its own error
            with contextlib.suppress(Exception):
                reply = await call(nc, subjects.request("tiny", "count"), CountGreetings())
                return int(reply["greetings"]) or None
            return None

        # The bootstrap ensured the streams and the declared durable with its declared config.
        info = await _until(lambda: _consumer(js, GREETINGS), "the tiny durable")
        assert info.config.filter_subject == GREETINGS.filter
        assert info.config.ack_wait == GREETINGS.ack_wait_s
        assert info.config.max_deliver == GREETINGS.max_deliver
        for name in ("ada", "grace", "ada"):  # a repeat is stored once
            payload = Greeting(name=name).model_dump_json().encode()
            await js.publish(subjects.work("greetings", name), payload)
        # Consumed and acked (after the insert): nothing left on the work queue.
        await _until(lambda: _drained(js, GREETINGS), "the work items to be acked")
        assert await _until(counted, "the service to answer") == 2

        async def live_beat() -> object | None:
            # A beat read on a busy machine can be a few intervals old: wait for a fresh one.
            beat = await read_beat(js, "tiny", "tiny-1")
            return beat if beat is not None and beat.live else None

        assert await _until(live_beat, "a live tiny heartbeat")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # A clean stop takes its beat away and stops answering.
        assert await read_beat(js, "tiny", "tiny-1") is None
        with pytest.raises(Exception, match="no service answers"):
            await call(nc, subjects.request("tiny", "count"), CountGreetings(), timeout_s=2)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await nc.close()


async def test_a_kit_service_beats_ready_only_once_its_brokers_answer(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `rollout up` handed over a stack on live beats alone, and a first request could meet a
    # tracker still starting: "no service answers" (the README commands test saw it in CI).
    gate = tiny_service.GATE = asyncio.Event()
    monkeypatch.setenv(
        EXTRA_ENV, "tiny=service_kit.tiny_service:serve_gated,idle=stack.dummy_services:idle"
    )
    task = asyncio.create_task(run_service("tiny", settings, replica_id="tiny-2", interval=0.2))
    idle = asyncio.create_task(run_service("idle", settings, replica_id="idle-1", interval=0.2))
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()

        async def beat_of(service: str, replica: str, ready: bool) -> Any:
            beat = await read_beat(js, service, replica)
            return beat if beat is not None and beat.live and beat.ready is ready else None

        # Alive, but not ready: its brokers wait on the gate, and nothing answers yet.
        await _until(lambda: beat_of("tiny", "tiny-2", False), "a live, not ready beat")
        with pytest.raises(RolloutError, match="no service answers"):
            await call(nc, subjects.request("tiny", "count"), CountGreetings(), timeout_s=2)

        async def status_of_tiny(healthy: bool) -> Any:
            # Polled: under load a 0.2 s beat can be past its 0.6 s live window for one look
            # ("no live heartbeat", seen in CI), though the service beats on.
            tiny = {c.name: c for c in await collect_status(settings)}["tiny"]
            starting = tiny.detail.endswith("1 still starting")
            return tiny if (tiny.healthy, starting) == (healthy, not healthy) else None

        await _until(lambda: status_of_tiny(False), "status: tiny live, still starting")
        monkeypatch.setenv("ROLLOUT_HOME", str(settings.home))
        assert cli_main(["health", "tiny"]) == 1  # the k8s probes' answer too
        assert "tiny: unhealthy: still starting" in capsys.readouterr().out
        # A service not built with the kit says nothing of readiness: ready at once.
        await _until(lambda: beat_of("idle", "idle-1", True), "the idle service's ready beat")
        gate.set()
        await _until(lambda: beat_of("tiny", "tiny-2", True), "a ready beat")
        tiny = await _until(lambda: status_of_tiny(True), "status: tiny healthy")
        assert "starting" not in tiny.detail, tiny
        assert cli_main(["health", "tiny"]) == 0
        assert "tiny: healthy" in capsys.readouterr().out
        reply = await call(nc, subjects.request("tiny", "count"), CountGreetings(), timeout_s=5)
        assert reply["greetings"] >= 0
    finally:
        for running in (task, idle):
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        await nc.close()


async def _consumer(js: Any, consumer: Consumer) -> Any:
    with contextlib.suppress(Exception):
        return await js.consumer_info(consumer.stream, consumer.name)
    return None


async def _drained(js: Any, consumer: Consumer) -> bool:
    info = await js.consumer_info(consumer.stream, consumer.name)
    return info.num_pending == 0 and info.num_ack_pending == 0


async def test_a_service_needing_a_database_without_one_is_told_so(
    nats_settings: Settings,
) -> None:
    async def build(runtime: ServiceRuntime) -> None:
        raise AssertionError("must not be reached")

    with pytest.raises(Exception, match="the tiny needs a database"):
        await serve_service("tiny", nats_settings, build, database=True)


async def test_the_bootstrap_creates_each_declared_consumer_as_declared(
    nats_settings: Settings,
) -> None:
    """Every platform durable, ensured from its declaration, has that config on the server."""
    declared = [c for role in SERVICE_ROLES.values() for c in role.consumes]
    nc = await connect_nats(nats_settings)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        await ensure_consumers(js, declared)
        for consumer in declared:
            info = await js.consumer_info(consumer.stream, consumer.name)
            assert info.config.filter_subject == consumer.filter, consumer.name
            assert info.config.ack_wait == consumer.ack_wait_s, consumer.name
            assert info.config.max_deliver == consumer.max_deliver, consumer.name
            assert info.config.max_ack_pending == consumer.max_ack_pending, consumer.name
    finally:
        await nc.close()


def test_roles_grant_the_very_declarations_the_services_subscribe_with() -> None:
    """A durable's name and filter live in one object: the role, the subscriber, the config."""
    every = [v for v in vars(durables).values() if isinstance(v, Consumer)]
    granted = [c for role in SERVICE_ROLES.values() for c in role.consumes]
    # The roles hold exactly the declared objects (not copies that could be edited apart).
    assert sorted(map(id, granted)) == sorted(map(id, every))
    names = ["env-registry", "tracker", "actor", "verifier", "learner", "buffer"]
    for name, broker in zip(names, asyncapi_brokers(), strict=True):
        role = SERVICE_ROLES[name]
        by_name = {c.name: c for c in role.consumes}
        pulled = {}
        for handler in broker.subscribers:
            durable = handler.extra_options.get("durable")
            if durable:
                pulled[durable] = handler
        assert set(pulled) == set(by_name), name
        for durable, handler in pulled.items():
            declared = by_name[durable]
            assert handler.subject.broker_address == declared.filter, durable
            assert handler.extra_options["stream"] == declared.stream, durable
        perms = service_permissions(role)["publish"]
        for consumer in role.consumes:
            api = subjects.js_api
            assert api("CONSUMER", "MSG", "NEXT", consumer.stream, consumer.name) in perms["allow"]
            create = api("CONSUMER", "CREATE", consumer.stream, consumer.name)
            assert any(a.startswith(create) for a in perms["allow"]), consumer.name
        # And no other service's durable may be pulled with this role.
        for other in set(SERVICE_ROLES) - {name}:
            for consumer in SERVICE_ROLES[other].consumes:
                next_ = subjects.js_api("CONSUMER", "MSG", "NEXT", consumer.stream, consumer.name)
                assert next_ in perms["deny"] and next_ not in perms["allow"], (name, consumer)


def test_a_tuned_consumer_keeps_its_identity() -> None:
    tuned = durables.ACTORS.tuned(ack_wait_s=3.0, batch_size=9)
    assert (tuned.stream, tuned.name, tuned.filter) == (
        durables.ACTORS.stream,
        durables.ACTORS.name,
        durables.ACTORS.filter,
    )
    assert tuned.config().ack_wait == 3.0
    for field in ("stream", "name", "filter"):
        with pytest.raises(ValueError, match="cannot be tuned"):
            durables.ACTORS.tuned(**{field: "other"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        durables.ACTORS.name = "other"  # type: ignore[misc]


def test_each_broker_has_its_own_routes_and_dependencies(settings: Settings) -> None:
    # Replicas of a service may share a process (the tests, `rollout up` in one process): one
    # broker's dependencies and subscribers must never be another's.
    from service_kit import tiny_service

    from rollout.shared.service.routes import service_broker

    a = service_broker(settings, tiny_service.ROUTES, pool="pool-a")
    b = service_broker(settings, tiny_service.ROUTES, pool="pool-b")
    assert (a.context.get("pool"), b.context.get("pool")) == ("pool-a", "pool-b")
    assert [repr(s.subject) for s in a.subscribers] == [
        f"Address({subjects.request_filter('tiny', 'count')!r})"
    ]
    assert a.subscribers[0] is not b.subscribers[0]
