"""Each service connects as its own NATS user, and the server lets it do its own work only.

The declarations in rollout.shared.auth.services are checked three ways: against the handlers
each service's broker registers (a handler outside its role fails here), against a real
nats-server (an actor's or a verifier's credential is refused everything it does not own), and
by running the whole pipeline with every service on its own credential with not one permission
violation in the server's log.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAI
from pipeline.kit import Platform, as_service, refund_agent, refund_env, wait_for_platform
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.services.catalog import asyncapi_brokers
from rollout.shared import subjects
from rollout.shared.auth.denials import PermissionWatch
from rollout.shared.auth.permissions import SERVICE_DURABLES
from rollout.shared.auth.services import (
    OPERATOR_EVENTS,
    SERVICE_ROLES,
    SUPERVISOR,
    all_durables,
    role_for,
    service_permissions,
    service_user,
)
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.contracts.envelope import payload_types
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.health import heartbeat_bucket
from rollout.shared.stack.nats import NatsServer
from rollout.shared.stack.services import SERVICES

# How long a refusal may take: the server's -ERR comes back in milliseconds.
REFUSED_WITHIN_S = 3.0
_VIOLATION = re.compile(
    r'"\$G/user:(svc_[\w-]+)" - (Publish|Subscription) Violation - Subject "([^"]+)"'
)


# --- the declarations against the services' own handlers ---------------------------------


def _handlers() -> dict[str, list[Any]]:
    """Every subscriber each built-in service's broker registers, by service name."""
    names = ["env-registry", "tracker", "actor", "verifier", "learner", "buffer"]
    return {
        name: list(broker.subscribers)
        for name, broker in zip(names, asyncapi_brokers(), strict=True)
    }


def test_every_handler_of_every_service_is_inside_its_role() -> None:
    assert set(SERVICES) <= set(SERVICE_ROLES), "a registered service has no declared role"
    for name, handlers in _handlers().items():
        role = SERVICE_ROLES[name]
        core = {subjects.request_filter(s, v) for s, v in role.answers} | set(role.follows)
        pulls = {(d.stream, d.name, d.filter) for d in role.consumes}
        seen_core, seen_pulls = set(), set()
        for handler in handlers:
            subject = handler.subject.broker_address
            durable = handler.extra_options.get("durable")
            if durable:
                key = (handler.extra_options["stream"], durable, subject)
                assert key in pulls, f"{name} pulls {key}, which its role does not declare"
                seen_pulls.add(key)
            else:
                assert subject in core, f"{name} subscribes to {subject}, outside its role"
                seen_core.add(subject)
        # Nothing granted that no handler uses (least privilege, both ways).
        assert seen_core == core, f"{name}'s role grants unused subscriptions"
        assert seen_pulls == pulls, f"{name}'s role declares consumers it does not pull"


def test_every_event_type_has_exactly_the_services_that_append_it() -> None:
    emitted = {t for role in SERVICE_ROLES.values() for t in role.emits}
    assert not emitted & set(OPERATOR_EVENTS), "a service may append the operator's events"
    assert emitted | set(OPERATOR_EVENTS) == set(payload_types()), (
        "an event type nobody may append, or a stale one"
    )
    lifecycle = {"run.requested", "run.started", "run.completed", "run.failed"}
    for name, role in SERVICE_ROLES.items():
        if name != "tracker":
            assert not lifecycle & set(role.emits), f"{name} may append run lifecycle events"


def test_keys_are_denied_every_durable_a_service_declares() -> None:
    assert {d.name for d in all_durables()} == set(SERVICE_DURABLES)


def test_only_the_tracker_may_reconfigure_streams_and_nobody_may_erase() -> None:
    for name, role in SERVICE_ROLES.items():
        perms = service_permissions(role)["publish"]
        allowed = perms["allow"]
        # Reads hold no consumer, so no consumer is deleted; every durable's deletion is denied.
        for durable in all_durables():
            delete = subjects.js_api("CONSUMER", "DELETE", durable.stream, durable.name)
            assert delete in perms["deny"], (name, durable.name)
        text = " ".join(allowed)
        assert ("STREAM.UPDATE" in text) == (name == "tracker"), name
        for verb in ("DELETE", "PURGE", "MSG.DELETE", "CONSUMER.DELETE"):
            assert f".{verb}." not in text and not text.endswith(f".{verb}"), (name, verb)
        assert ">" not in [a.split(".")[-1] for a in allowed if a.startswith("rollout.evt")]


# --- a real server: what a service credential is refused ---------------------------------


@pytest.fixture
async def streams(nats_settings: Settings) -> None:
    """The platform streams and the heartbeat bucket exist (as the admin made them)."""
    nc = await connect_nats(nats_settings)
    try:
        await ensure_streams(nc.jetstream())
        await heartbeat_bucket(nc.jetstream())
    finally:
        await nc.close()


class As:
    """A connection as one service's user, with a watch that fails refused requests fast."""

    def __init__(self, settings: Settings, service: str) -> None:
        self.settings = as_service(settings, service)
        self.watch = PermissionWatch(self.settings.nats_user)
        self.errors: list[str] = []
        self.nc: Any = None

    async def __aenter__(self) -> As:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))
            await self.watch.error_cb(exc)

        self.nc = await connect_nats(self.settings, error_cb=on_error)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    async def refused_request(self, subject: str, payload: bytes = b"") -> RolloutError:
        """Send a request the server must refuse; return the denial (never a timeout)."""
        request = self.nc.request(subject, payload, timeout=30)
        with pytest.raises(RolloutError, match="permission denied") as caught:
            await asyncio.wait_for(self.watch.guard(subject, request), REFUSED_WITHIN_S)
        return caught.value

    async def violation(self, subject: str) -> None:
        """Wait until the server reports a violation naming `subject`."""

        async def reported() -> bool:
            await self.nc.flush()
            return any(subject.lower() in e.lower() for e in self.errors)

        try:
            await wait_until(
                reported, f"a violation for {subject}", REFUSED_WITHIN_S, interval_s=0.02
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.errors}") from None


async def _count(settings: Settings, filter_subject: str) -> int:
    nc = await connect_nats(settings)
    try:
        return len([m async for m in read_events(nc.jetstream(), filter_subject)])
    finally:
        await nc.close()


async def test_an_actor_cannot_append_lifecycle_events_or_erase_or_read_requests(
    nats_settings: Settings, nats_server: NatsServer, streams: None
) -> None:
    offset = nats_server.log_path.stat().st_size
    run = subjects.event("run", "r1", subjects.event_name("run.completed"))
    async with As(nats_settings, "actor") as actor:
        js = actor.nc.jetstream()
        for event_type in ("run.completed", "run.failed", "run.started", "rollout.scored"):
            subject = subjects.event("run", "r1", subjects.event_name(event_type))
            await actor.refused_request(subject, b"{}")
        for other in ("env.registered", "policy.updated", "job.completed"):
            model = payload_types()[other]
            await actor.refused_request(
                subjects.event(model.aggregate, "x1", subjects.event_name(other)), b"{}"
            )
        # Its own event type goes through.
        ack = await js.publish(
            subjects.event("run", "r1", subjects.event_name("rollout.generated")), b"{}"
        )
        assert ack.stream == subjects.EVENTS_STREAM
        for stream in (subjects.EVENTS_STREAM, subjects.WORK_STREAM):
            await actor.refused_request(subjects.js_api("STREAM", "PURGE", stream))
            await actor.refused_request(subjects.js_api("STREAM", "DELETE", stream))
            await actor.refused_request(subjects.js_api("STREAM", "UPDATE", stream), b"{}")
        await actor.refused_request(
            subjects.js_api("STREAM", "MSG", "DELETE", subjects.EVENTS_STREAM)
        )
        await actor.refused_request(
            subjects.js_api("CONSUMER", "DELETE", subjects.EVENTS_STREAM, "verifier")
        )
        # Another service's durable, and work it does not do.
        await actor.refused_request(
            subjects.js_api("CONSUMER", "MSG", "NEXT", subjects.EVENTS_STREAM, "verifier"), b"1"
        )
        await actor.refused_request(
            subjects.js_api("CONSUMER", "MSG", "NEXT", subjects.WORK_STREAM, "learner"), b"1"
        )
        await actor.refused_request(subjects.work("rollouts", "r1"), b"{}")
        await actor.refused_request(subjects.work("jobs", "j1"), b"{}")
        # Another service's health.
        await actor.refused_request(f"$KV.{subjects.HEARTBEATS_BUCKET}.tracker.fake", b"{}")
        # Nobody's requests or replies but its own.
        for subject in (
            subjects.request("tracker", "create_run"),
            subjects.request("registry", "push"),
            subjects.request("learner", "create_job"),
            subjects.inbox_filter(service_user("tracker")),
            "_INBOX.>",
            subjects.ALL_EVENTS,
        ):
            await actor.nc.subscribe(subject)
            await actor.violation(subject)
    assert await _count(nats_settings, run) == 0
    # The server logs each refusal with the user (what the pipeline test below reads).
    logged = _VIOLATION.findall(nats_server.log_path.read_bytes()[offset:].decode())
    assert ("svc_actor", "Publish", run) in logged
    assert ("svc_actor", "Subscription", "_INBOX.>") in logged


async def test_a_verifier_cannot_queue_work_or_append_what_others_own(
    nats_settings: Settings, streams: None
) -> None:
    async with As(nats_settings, "verifier") as verifier:
        await verifier.refused_request(subjects.work("rollouts", "r1"), b"{}")
        await verifier.refused_request(subjects.work("jobs", "j1"), b"{}")
        for event_type in ("rollout.generated", "run.completed", "run.requested"):
            subject = subjects.event("run", "r1", subjects.event_name(event_type))
            await verifier.refused_request(subject, b"{}")
        await verifier.refused_request(subjects.request("tracker", "create_run"), b"{}")
        ack = await verifier.nc.jetstream().publish(
            subjects.event("run", "r1", subjects.event_name("rollout.scored")), b"{}"
        )
        assert ack.stream == subjects.EVENTS_STREAM
    assert await _count(nats_settings, subjects.work_filter("rollouts")) == 0


def test_each_service_may_record_dead_letters_under_its_own_consumers_only() -> None:
    everyone = subjects.dead_letter()
    for name, role in SERVICE_ROLES.items():
        allowed = service_permissions(role)["publish"]["allow"]
        letters = [a for a in allowed if a.startswith(everyone.split("*")[0])]
        assert everyone not in allowed, name
        assert letters == [subjects.dead_letter(d.name) for d in role.consumes], name
    learner = SERVICE_ROLES["learner"]
    [follower] = [d for d in learner.consumes if d.name == "learner-deadletters"]
    assert follower.filter == subjects.dead_letter("learner")


async def test_an_actor_cannot_forge_a_learner_dead_letter(
    nats_settings: Settings, streams: None
) -> None:
    forged = subjects.dead_letter("learner")
    async with As(nats_settings, "actor") as actor:
        await actor.refused_request(forged, b"{}")
        for other in ("verifier", "tracker-read-models", "learner-deadletters"):
            await actor.refused_request(subjects.dead_letter(other), b"{}")
        # Under its own consumer's name it may (the dead-letter policy records them so).
        ack = await actor.nc.jetstream().publish(subjects.dead_letter("actors"), b"{}")
        assert ack.stream == subjects.EVENTS_STREAM
    assert await _count(nats_settings, forged) == 0


async def test_a_service_reads_without_a_consumer_and_deletes_none(
    nats_settings: Settings, streams: None
) -> None:
    admin = await connect_nats(nats_settings)
    try:
        await admin.jetstream().publish(
            subjects.event("job", "j1", subjects.event_name("job.requested")), b"{}"
        )
    finally:
        await admin.close()
    async with As(nats_settings, "learner") as learner:
        js = learner.nc.jetstream()
        # How the learner loads a job to decide its ending (journal.job_history).
        read = read_events(js, subjects.aggregate_events("job", "j1"))
        assert len([m async for m in read]) == 1
        assert learner.errors == []
        assert (await js.stream_info(subjects.EVENTS_STREAM)).state.consumer_count == 0
        await learner.refused_request(
            subjects.js_api("CONSUMER", "DELETE", subjects.EVENTS_STREAM, "learner-deadletters")
        )
        await learner.refused_request(
            subjects.js_api("CONSUMER", "CREATE", subjects.EVENTS_STREAM, "mine", ">")
        )


async def test_an_extra_service_only_beats_and_reads(nats_server: NatsServer) -> None:
    role = role_for("my-extra")
    perms = service_permissions(role)
    assert not role.emits and not role.answers and not role.consumes
    assert perms["subscribe"]["allow"] == [subjects.inbox_filter(service_user("my-extra"))]
    assert SUPERVISOR in nats_server.services


async def test_the_learner_asks_the_buffer_under_its_own_user(settings: Settings) -> None:
    # Training-set requests name their caller (subjects.attributed): the learner's on the
    # anonymous subject were refused by the server and timed out as "buffer unavailable".
    from rollout.services.learner.training_sets import BufferUnavailable, ask
    from rollout.shared.contracts.buffer import SftSetQuery

    platform = Platform(settings)
    platform.start("buffer")
    try:
        async with As(settings, "learner") as learner:

            async def answered() -> bool:
                platform.check()
                try:
                    await ask(learner.nc, None, "sft_set", SftSetQuery(run_id="r1"), timeout_s=2)
                except BufferUnavailable:
                    return False
                except RolloutError as exc:
                    assert "r1" in exc.message, exc  # the buffer's answer: no such run
                return True

            await wait_until(answered, "the buffer to answer the learner", 30)
            assert learner.errors == []
    finally:
        await platform.stop_all()


# --- the whole pipeline with every service on its own credential -------------------------


@pytest.fixture
async def own_platform(settings: Settings) -> AsyncIterator[Platform]:
    p = Platform(settings)
    for name in ("env-registry", "tracker", "verifier", "actor", "buffer", "learner"):
        p.start(name)
    yield p
    p.check()
    await p.stop_all()


async def test_the_pipeline_completes_with_every_service_on_its_own_credential(
    settings: Settings, nats_server: NatsServer, own_platform: Platform
) -> None:
    offset = nats_server.log_path.stat().st_size
    for name, entry in nats_server.services.items():
        assert entry["user"] == service_user(name)
        assert entry["password"] not in nats_server.config_path.read_text()
    client = AsyncClient(settings, timeout_s=20)
    try:
        await wait_for_platform(client, own_platform)
        with FakeOpenAI(refund_agent) as agent:
            await client.push_environment(refund_env(tasks=2))
            run = await client.create_run(
                "refunds", f"{agent.base_url}#scripted", n=4, batch_size=3, temperature=0.0
            )
            done = await client.wait_for_run(run["runId"], timeout_s=120)
        assert done["status"] == "completed", done
        assert (done["total"], done["scored"]) == (8, 8)
    finally:
        await client.close()
    own_platform.check()
    log = nats_server.log_path.read_bytes()[offset:].decode(errors="replace")
    violations = [m.groups() for m in _VIOLATION.finditer(log)]
    assert violations == [], f"services were refused: {violations}"


async def test_rollout_serve_picks_its_own_credential(tmp_path: Any) -> None:
    from rollout.shared.auth.credentials import load_or_create_credentials
    from rollout.shared.settings import load_settings

    home = tmp_path / "home"
    creds = load_or_create_credentials(home, ["tracker", "actor"])
    env = {"ROLLOUT_HOME": str(home)}
    assert load_settings(env).nats_user == creds["nats"]["user"] == "rollout"
    actor = load_settings(env, service="actor")
    assert (actor.nats_user, actor.nats_password) == (
        "svc_actor",
        creds["services"]["actor"]["password"],
    )
    with pytest.raises(RolloutError, match="no NATS credential for service 'verifier'"):
        load_settings(env, service="verifier")
    # An external NATS: the deployment gives each service its own user and password.
    external = env | {
        "ROLLOUT_NATS_URL": "nats://nats:4222",
        "ROLLOUT_NATS_USER": "svc_verifier",
        "ROLLOUT_NATS_PASSWORD": "p",
    }
    assert load_settings(external, service="verifier").nats_user == "svc_verifier"
