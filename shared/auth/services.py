"""Each platform service's own NATS user, and the least the server lets it do.

One declaration per service (SERVICE_ROLES) says what it answers, what it asks other services,
which event types it appends, which work it queues and which durable consumers it pulls from.
The nats-server `permissions` block of its user is derived from that declaration alone
(`service_permissions`), and tests/auth checks every handler a service's broker registers
against it, so a handler the role does not cover fails a test before it fails in production.

What every service may do besides: read and follow the events stream (like a viewer key, the
other services' durables excepted), look up and create (never reconfigure) the platform
streams, beat its own heartbeat key, receive replies only on its own inbox prefix, and answer
the requests it received (`allow_responses`). Reads of the events stream are direct gets and
hold no consumer; a service creates only its own declared durables. Only the stream manager
(the tracker) may update a stream's configuration; nothing here may delete or purge a stream,
delete a message or a consumer, or touch a durable it does not own. The unrestricted admin user
(`rollout admin ...`, `rollout keys ...`, tests) is held by no long-running service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout.shared import subjects
from rollout.shared.auth.users import service_user
from rollout.shared.contracts.envelope import payload_types
from rollout.shared.service import durables
from rollout.shared.service.consumer import Consumer
from rollout.shared.stack.health import beat_key

# The `rollout up` supervisor's own user: it only waits for the services' heartbeats.
SUPERVISOR = "supervisor"


# A durable pull consumer a service owns: its stream, name and filter are what the permissions
# pin. The roles below hold the very declarations the services consume with.
Durable = Consumer


@dataclass(frozen=True)
class ServiceRole:
    """What one service does on the bus; its NATS permissions are derived from this only."""

    service: str
    # (service, verb) requests it answers, as a queue group.
    answers: tuple[tuple[str, str], ...] = ()
    # (service, verb) requests it sends to other services.
    calls: tuple[tuple[str, str], ...] = ()
    # Event types it appends (`run.started`): only those subjects, for any aggregate id
    # (dead letters: only under the names of the consumers below).
    emits: tuple[str, ...] = ()
    # Work kinds it queues on the work stream.
    queues: tuple[str, ...] = ()
    # Durable pull consumers it creates and pulls from (and acks on).
    consumes: tuple[Durable, ...] = ()
    # Core subscriptions to event subjects (live notifications, no consumer).
    follows: tuple[str, ...] = ()
    # May update the platform streams' configuration (others only create a missing stream).
    manages_streams: bool = False
    # May read every service's heartbeat (the supervisor waits on them).
    reads_heartbeats: bool = False
    # Leader leases it may take, renew and give up (keys of the leases bucket).
    leases: tuple[str, ...] = ()

    @property
    def user(self) -> str:
        """The NATS user name: `svc_<service>`."""
        return service_user(self.service)


_EVENTS = subjects.EVENTS_STREAM
_WORK = subjects.WORK_STREAM
_DEAD_LETTER = subjects.DEAD_LETTER_EVENT

SERVICE_ROLES: dict[str, ServiceRole] = {
    role.service: role
    for role in (
        ServiceRole(
            "env-registry",
            answers=(
                ("registry", "push"),
                ("registry", "get"),
                ("registry", "list"),
                ("registry", "audit"),
            ),
            emits=("env.registered", "env.audited"),
        ),
        ServiceRole(
            "tracker",
            answers=(
                ("tracker", "create_run"),
                ("tracker", "cancel_run"),
                ("tracker", "get_run"),
                ("tracker", "list_runs"),
                ("tracker", "get_job"),
                ("tracker", "list_jobs"),
                ("tracker", "record_plan_event"),
                ("tracker", "import_run"),
            ),
            # Before it records a run: can the actors generate with its model?
            calls=(("actor", "check_model"),),
            emits=(
                "run.requested",
                "run.started",
                "run.work_released",
                "run.completed",
                "run.failed",
                # An imported run's rollouts and verdicts (imports.py).
                "rollout.generated",
                "rollout.scored",
                _DEAD_LETTER,
                # Experiment plans' histories, recorded for the CLI that drives them.
                "plan.started",
                "plan.stage_started",
                "plan.stage_completed",
                "plan.stage_failed",
                "plan.completed",
                "plan.failed",
                # What a key's runs cost its budget a day (shared/aggregates/quota.py).
                "quota.charged",
            ),
            queues=("rollouts",),
            consumes=(
                durables.TRACKER_READ_MODELS,
                durables.TRACKER_FANOUT,
            ),
            manages_streams=True,
            # Replicas elect one leader for the projection and the process manager.
            leases=("tracker",),
        ),
        ServiceRole(
            "actor",
            answers=(("actor", "check_model"),),
            emits=("rollout.generated", _DEAD_LETTER),
            consumes=(durables.ACTORS,),
            # New policy versions to load; failed runs whose generation stops.
            follows=(
                subjects.event_filter("policy", "policy.updated"),
                subjects.event_filter("run", "run.failed"),
            ),
        ),
        ServiceRole(
            "verifier",
            emits=("rollout.scored", _DEAD_LETTER),
            consumes=(durables.VERIFIER,),
        ),
        ServiceRole(
            "buffer",
            answers=(
                ("buffer", "sft_set"),
                ("buffer", "dpo_pairs"),
                ("buffer", "grpo_groups"),
                ("buffer", "rollouts"),
            ),
            emits=(_DEAD_LETTER,),
            consumes=(durables.BUFFER,),
        ),
        ServiceRole(
            "learner",
            answers=(("learner", "create_job"), ("learner", "cancel_job")),
            # Online GRPO starts its own generation runs (and cancels them with its job) and
            # builds batches from the buffer.
            calls=(
                ("tracker", "create_run"),
                ("tracker", "cancel_run"),
                ("buffer", "sft_set"),
                ("buffer", "dpo_pairs"),
                ("buffer", "grpo_groups"),
            ),
            emits=(
                "job.requested",
                "job.started",
                "job.progress",
                "job.completed",
                "job.failed",
                "checkpoint.saved",
                "policy.updated",
                # What a key's jobs cost its budget a day (shared/aggregates/quota.py).
                "quota.charged",
                _DEAD_LETTER,
            ),
            queues=("jobs",),
            consumes=(
                durables.LEARNER_JOBS,
                # Only the dead letters its own job consumer recorded (see deadletters.py).
                durables.LEARNER_DEADLETTERS,
            ),
        ),
        ServiceRole(SUPERVISOR, reads_heartbeats=True),
    )
}

# Event types only the admin user appends (the operator's `rollout keys limit`): no service
# may set a key's limits, so none can lift the budgets it enforces.
OPERATOR_EVENTS: tuple[str, ...] = ("key.limits_set",)

# The streams every service may look up and create when missing (`ensure_streams`).
PLATFORM_STREAMS: tuple[str, ...] = (_EVENTS, _WORK)


def all_durables() -> list[Durable]:
    """Every durable consumer some service owns."""
    return [durable for role in SERVICE_ROLES.values() for durable in role.consumes]


def role_for(service: str) -> ServiceRole:
    """The declared role of `service`; an undeclared (extra) service only beats and reads."""
    return SERVICE_ROLES.get(service) or ServiceRole(service)


def _event_subject(event_type: str) -> str:
    # The event models register themselves with the envelope on import.

    model = payload_types().get(event_type)
    if model is None:
        raise ValueError(f"service role names unknown event type {event_type!r}")
    return subjects.event_filter(model.aggregate, event_type)


def _consumer_subjects(durable: Durable) -> list[str]:
    api = subjects.js_api
    # nats-py puts the filter in the create subject (the server checks it matches the body),
    # so the permission pins the filter too; `>` itself is sent without one.
    create = (
        api("CONSUMER", "CREATE", durable.stream, durable.name)
        if durable.filter == ">"
        else api("CONSUMER", "CREATE", durable.stream, durable.name, durable.filter)
    )
    return [
        create,
        api("CONSUMER", "INFO", durable.stream, durable.name),
        api("CONSUMER", "MSG", "NEXT", durable.stream, durable.name),
        # Acks, naks, in-progress and term of its own deliveries only.
        f"$JS.ACK.{durable.stream}.{durable.name}.>",
    ]


def _heartbeat_subjects(role: ServiceRole) -> list[str]:
    bucket = subjects.HEARTBEATS_BUCKET
    stream = f"KV_{bucket}"
    api = subjects.js_api
    own = beat_key(role.service, "x").rsplit(".", 1)[0]
    allowed = [
        api("STREAM", "INFO", stream),
        api("STREAM", "CREATE", stream),
        # Its own beats only: a service cannot fake another one's health.
        f"$KV.{bucket}.{own}.>",
    ]
    if role.reads_heartbeats:
        allowed += [api("STREAM", "MSG", "GET", stream), api("DIRECT", "GET", stream, ">")]
    return allowed


def _lease_subjects(role: ServiceRole) -> list[str]:
    if not role.leases:
        return []
    bucket = subjects.LEASES_BUCKET
    stream = f"KV_{bucket}"
    api = subjects.js_api
    allowed = [api("STREAM", "INFO", stream), api("STREAM", "CREATE", stream)]
    for name in role.leases:
        # Its own leases only (writes and direct reads): it cannot depose another service.
        allowed += [f"$KV.{bucket}.{name}", api("DIRECT", "GET", stream, f"$KV.{bucket}.{name}")]
    return allowed


def event_reader_subjects() -> list[str]:
    """JetStream API subjects needed to read and follow the events stream, and nothing more.

    Reads are direct gets (shared/bus/reader.py): no consumer. Creating one is not allowed,
    so nothing a key does can fill the stream's consumer limit, past which nats-server refuses
    every create on the stream, the services' own durables included.
    """
    stream = subjects.EVENTS_STREAM
    return [
        subjects.js_api("INFO"),
        subjects.js_api("STREAM", "NAMES"),
        subjects.js_api("STREAM", "INFO", stream),
        subjects.js_api("DIRECT", "GET", stream),
        subjects.js_api("DIRECT", "GET", stream, ">"),
        subjects.js_api("STREAM", "MSG", "GET", stream),
    ]


def service_permissions(role: ServiceRole) -> dict[str, Any]:
    """The nats-server `permissions` block of a service's user, from its declaration."""
    api = subjects.js_api
    publish: list[str] = [subjects.request(s, v, role.user) for s, v in role.calls]
    publish += [
        _event_subject(event_type) for event_type in role.emits if event_type != _DEAD_LETTER
    ]
    if _DEAD_LETTER in role.emits:
        # Dead letters only under its own consumers' names: none can be forged for another's.
        publish += [subjects.dead_letter(durable.name) for durable in role.consumes]
    publish += [subjects.work_filter(kind) for kind in role.queues]
    if role.queues:
        # Whether an item it queued is still there (a retried create re-queues a lost one).
        publish.append(api("STREAM", "MSG", "GET", subjects.WORK_STREAM))
    publish += event_reader_subjects()
    for stream in PLATFORM_STREAMS:
        publish += [api("STREAM", "INFO", stream), api("STREAM", "CREATE", stream)]
        if role.manages_streams:
            publish.append(api("STREAM", "UPDATE", stream))
    for durable in role.consumes:
        publish += _consumer_subjects(durable)
    publish += _heartbeat_subjects(role)
    publish += _lease_subjects(role)
    publish.append(subjects.USER_INFO)
    own = {(d.stream, d.name) for d in role.consumes}
    deny = [
        subject
        for d in all_durables()
        if (d.stream, d.name) not in own
        for subject in (
            api("CONSUMER", "MSG", "NEXT", d.stream, d.name),
            api("CONSUMER", "CREATE", d.stream, d.name),
            api("CONSUMER", "CREATE", d.stream, d.name, ">"),
        )
    ]
    # No durable is deleted by a service, its own included.
    deny += [api("CONSUMER", "DELETE", d.stream, d.name) for d in all_durables()]
    subscribe = [subjects.inbox_filter(role.user)]
    subscribe += [subjects.request_filter(s, v) for s, v in role.answers]
    subscribe += list(role.follows)
    return {
        "publish": {"allow": _unique(publish), "deny": _unique(deny)},
        "subscribe": {"allow": _unique(subscribe)},
        # Replies to the requests it received (and acks of the messages it was delivered).
        "allow_responses": True,
    }


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def password_hash_placeholder(service: str) -> str:
    """The template variable a deployment's infrastructure code fills with a service's hash."""
    return "password_hash_" + subjects.token(service, "service").replace("-", "_")


def _template_literal(text: str) -> str:
    # Terraform template syntax starts at `${` and `%{`; anything else is literal.
    return text.replace("${", "$${").replace("%{", "%%{")


def authorization_template(services: list[str]) -> str:
    """The nats-server `authorization` block with Terraform template variables for the secrets.

    The same users and permissions `rollout admin nats-config` writes (the admin, then one user
    per service with its role's permissions); in place of each bcrypt hash a variable the
    infrastructure code fills in from its own generated passwords: `admin_user`,
    `admin_password_hash` and `password_hash_<service>` (`-` as `_`). No secret is in it.
    """
    import json

    users = ['{"user": "${admin_user}", "password": "${admin_password_hash}"}']
    for name in services:
        permissions = _template_literal(json.dumps(service_permissions(role_for(name))))
        user = _template_literal(json.dumps(service_user(name)))
        placeholder = "${" + password_hash_placeholder(name) + "}"
        users.append(
            f'{{"user": {user}, "password": "{placeholder}", "permissions": {permissions}}}'
        )
    return "\n".join(
        ["authorization {", "  users = [", *(f"    {u}" for u in users), "  ]", "}", ""]
    )
