"""Env registry handlers: push (validate, version, append), get, list and audit."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from rollout.shared import subjects
from rollout.shared.aggregates.append import decide_and_append
from rollout.shared.audit import audit
from rollout.shared.auth.ownership import describe, may_change
from rollout.shared.bus.broker import jetstream
from rollout.shared.bus.publisher import ConcurrencyConflict, EventPublisher, payload_budget
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import EnvAudited, EnvRegistered
from rollout.shared.contracts.requests import (
    AuditEnvironment,
    GetEnvironment,
    ListEnvironments,
    PushEnvironment,
    Reply,
)
from rollout.shared.envs.coerce import TOO_LARGE_HINT, as_spec
from rollout.shared.envs.starts import check_starts
from rollout.shared.envs.validation import validate_environment
from rollout.shared.errors import RolloutError
from rollout.shared.observability import get_logger
from rollout.shared.service.routes import CurrentBroker, caller, request_route
from rollout.shared.store import env_versions as versions

QUEUE = "env-registry"

log = get_logger(__name__)


def summary(env: EnvRegistered, *, with_spec: bool = False) -> dict:
    """The reply form of an environment version."""
    out = env.model_dump(mode="json")
    if not with_spec:
        out.pop("spec")
    return out


def check_slug_owner(slug: str, owner: str | None, pusher: str) -> None:
    """RolloutError unless `pusher` may push a new version of `slug`, owned by `owner`.

    A slug is the key's that pushed its first version: runs pick up its newest version, so a
    colleague's key must not replace its tasks or verifier. The admin and the services may;
    slugs registered before owners were kept are not checked.
    """
    if may_change(pusher, owner):
        return
    raise RolloutError(
        f"environment {slug!r} belongs to {describe(owner)} (it pushed the first version), not "
        f"to {describe(pusher)}: a key may push new versions only of its own environments; "
        "push yours under another slug, or ask its owner (or whoever holds the admin "
        "credentials) to push this one"
    )


async def push(cmd: PushEnvironment, broker: CurrentBroker) -> Reply:
    """Validate a spec; append a new version unless the newest has the same content.

    The first version's pusher (the caller the request's subject names) owns the slug; only it,
    the admin and the services may push later versions (check_slug_owner).
    """
    # A plugin env is imported in a sandboxed plugin host: wait for it off the event loop.
    problems = await asyncio.to_thread(validate_environment, cmd.spec)
    warnings: list[str] = []
    if not problems and isinstance(cmd.spec, dict) and cmd.spec.get("template") == "plugin":
        # As `rollout plan` and `rollout push` say: a task whose episode cannot start (the
        # plugin's reset() raising on it) fails each of its rollouts.
        check = await asyncio.to_thread(check_starts, as_spec(cmd.spec))
        problems, warnings = check.problems, check.warnings
    if problems:
        slug = cmd.spec.get("slug") if isinstance(cmd.spec, dict) else None
        raise RolloutError(f"environment {slug or '?'!r} is invalid", problems=problems)
    spec = as_spec(cmd.spec)
    js = jetstream(broker)
    digest = spec.spec_hash()
    pusher = caller(broker)

    def decide(latest: tuple[EnvRegistered | None, int]) -> EnvRegistered | None:
        newest, _ = latest
        if newest is not None and newest.spec_hash == digest:
            return None  # the same content: its version stands
        if newest is not None:
            check_slug_owner(spec.slug, newest.owner, pusher)
        return EnvRegistered(
            slug=spec.slug,
            version=(newest.version + 1) if newest else 1,
            spec_hash=digest,
            name=spec.name,
            template=spec.template,
            task_count=len(spec.tasks),
            spec=spec.to_json_dict(),
            owner=newest.owner if newest is not None else pusher,
        )

    async def append(latest: tuple[EnvRegistered | None, int], event: EnvRegistered) -> None:
        envelope = EventEnvelope.new(
            event, aggregate_id=spec.slug, id_parts=(spec.slug, event.version, digest)
        )
        data, budget = envelope.to_bytes(), payload_budget(js)
        if len(data) > budget:
            # A request just under max_payload is an event just over it: said as the client
            # says a request over it, not as the publisher's advice to claim-check a batch.
            raise RolloutError(
                f"environment {spec.slug!r} is too large to register: {len(data):,} bytes as "
                f"an event, over the {budget:,} the server accepts in one message",
                problems=[TOO_LARGE_HINT],
            )
        await EventPublisher(js).publish(envelope, expected_last_subject_seq=latest[1], data=data)

    try:
        # Another push may land first: re-read and decide again.
        (newest, _), event = await decide_and_append(
            lambda: versions.latest(js, spec.slug), decide, append, what=spec.slug
        )
    except ConcurrencyConflict:
        raise RolloutError(
            f"environment {spec.slug!r} is being pushed concurrently; try again"
        ) from None
    if event is None:
        assert newest is not None
        return Reply(data={**summary(newest), "created": False, "warnings": warnings})
    log.info("environment registered", slug=spec.slug, version=event.version, by=pusher)
    return Reply(data={**summary(event), "created": True, "warnings": warnings})


async def _registered(js: Any, slug: str, version: int | None) -> EnvRegistered:
    """One version of `slug` (newest when None); RolloutError saying how to get one."""
    subjects.token(slug, "environment slug")
    if version is None:
        found, _ = await versions.latest(js, slug)
    else:
        found = await versions.version(js, slug, version)
    if found is None:
        what = f"version {version} of " if version else ""
        raise RolloutError(f"no {what}environment {slug!r}; push it with `rollout push`")
    return found


async def get(query: GetEnvironment, broker: CurrentBroker) -> Reply:
    """One version (newest by default), with its spec."""
    found = await _registered(jetstream(broker), query.slug, query.version)
    return Reply(data=summary(found, with_spec=True))


async def list_(query: ListEnvironments, broker: CurrentBroker) -> Reply:
    """Every environment's newest version."""
    found = await versions.all_latest(jetstream(broker))
    return Reply(data={"environments": [summary(e) for e in found]})


# The event keeps this many findings (the reply has them all); the count is kept too.
MAX_AUDIT_FINDINGS = 500
# One audit at a time per registry replica: an audit runs env code (sandboxes, plugin hosts) for
# up to minutes, and a key holder asking for many must not starve pushes and gets.
_AUDITING = asyncio.Semaphore(1)


async def audit_env(cmd: AuditEnvironment, broker: CurrentBroker) -> Reply:
    """Run every applicable adversarial policy on a registered version, here, where it is
    served (its templates, sandbox and plugin hosts); append `env.audited`; reply the report.

    The audit runs in the service, not the client, so the recorded result is the platform's
    own: a user cannot record a clean audit of an env that is not.
    """
    js = jetstream(broker)
    found = await _registered(js, cmd.slug, cmd.version)
    spec = as_spec(found.spec)
    if cmd.split is not None and not any(t.split == cmd.split for t in spec.tasks):
        splits = sorted({t.split for t in spec.tasks})
        raise RolloutError(f"split: {cmd.slug!r} has no {cmd.split!r} tasks (splits: {splits})")
    if _AUDITING.locked():
        raise RolloutError("the registry is running another audit; try again when it ends")
    async with _AUDITING:
        report = await audit(spec, split=cmd.split, threshold=cmd.threshold, limit=cmd.limit)
    document = report.to_json()
    event = EnvAudited(
        slug=spec.slug,
        version=found.version,
        split=cmd.split,
        threshold=cmd.threshold,
        tasks=len(report.tasks),
        policies=report.policies,
        hackable_tasks=report.hackable,
        findings=document["findings"][:MAX_AUDIT_FINDINGS],
        findings_total=len(document["findings"]),
        errors=len(report.errors),
        policy_errors=report.policy_errors[:MAX_AUDIT_FINDINGS],
        seconds=round(report.seconds, 3),
    )
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
    envelope = EventEnvelope.new(
        event, aggregate_id=spec.slug, id_parts=(spec.slug, found.version, "audit", digest)
    )
    await EventPublisher(js).publish(envelope)
    log.info("environment audited", slug=spec.slug, version=found.version,
             hackable=len(report.hackable), findings=len(report.findings))  # fmt: skip
    return Reply(data=document | {"version": found.version})


ROUTES = [
    request_route(push, "registry", "push", queue=QUEUE),
    request_route(get, "registry", "get", queue=QUEUE),
    request_route(list_, "registry", "list", queue=QUEUE),
    request_route(audit_env, "registry", "audit", queue=QUEUE),
]
