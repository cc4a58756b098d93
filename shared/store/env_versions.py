"""Environment versions as events: the env's subject history is its version list (shared by services)."""

from __future__ import annotations

import json

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rollout.shared import subjects
from rollout.shared.bus.reader import read_events
from rollout.shared.contracts.envelope import EventEnvelope
from rollout.shared.contracts.events import EnvRegistered

_NAME = "env_registered"


def env_subject(slug: str) -> str:
    """Subject of one environment's registrations."""
    return subjects.event("env", slug, _NAME)


async def latest(js: JetStreamContext, slug: str) -> tuple[EnvRegistered | None, int]:
    """The newest registration of `slug` and its stream sequence (None, 0 when unknown)."""
    try:
        raw = await js.get_last_msg(subjects.EVENTS_STREAM, env_subject(slug))
    except NotFoundError:
        return None, 0
    event = EventEnvelope.from_bytes(raw.data)
    return EnvRegistered.model_validate(event.payload), raw.seq


async def version(js: JetStreamContext, slug: str, number: int) -> EnvRegistered | None:
    """One specific version of `slug`."""
    newest, _ = await latest(js, slug)
    if newest is None or number > newest.version:
        return None
    if number == newest.version:
        return newest
    async for msg in read_events(js, env_subject(slug)):
        found = EnvRegistered.model_validate(json.loads(msg.data)["payload"])
        if found.version == number:
            return found
    return None


async def all_latest(js: JetStreamContext) -> list[EnvRegistered]:
    """The newest registration of every environment, by slug."""
    info = await js.stream_info(
        subjects.EVENTS_STREAM, subjects_filter=subjects.aggregate_events("env")
    )
    out = []
    # An env's subjects: its registrations and its audits; each slug once.
    slugs = {subjects.parse_event_subject(subject)[1] for subject in info.state.subjects or {}}
    for slug in sorted(slugs):
        found, _ = await latest(js, slug)
        if found is not None:
            out.append(found)
    return out
