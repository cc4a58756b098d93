"""The NATS permissions of a key's role: what shared/auth/roles.py says it may do, as the
server enforces it.

Apart from roles.py because they name the services' durable consumers, whose declarations
load faststream: a key's CLI reads its role (`rollout whoami`) without them.
"""

from __future__ import annotations

from typing import Any

from rollout.shared import subjects
from rollout.shared.auth.roles import ROLE_REQUESTS, Role
from rollout.shared.auth.services import all_durables, event_reader_subjects
from rollout.shared.service.durables import PROJECTIONS

# Durable consumers the services keep (declared with each service's role). A key reads the
# events stream with direct gets and may create no consumer on it (one more per read would let
# a key fill the stream's consumer limit: docs/scaling.md); these are denied to it by name too,
# so no later allow can let a key pull from them (a pulled, unacked message is redelivered late
# and counts towards the service's max-deliver, then is dead-lettered) or recreate them.
SERVICE_DURABLES: tuple[str, ...] = tuple(dict.fromkeys(d.name for d in all_durables()))


def permissions(role: Role, user: str) -> dict[str, Any] | None:
    """The nats-server `permissions` block for `user` in `role` (None: unrestricted)."""
    if role is Role.SERVICE:
        return None
    publish = [subjects.request(service, verb, user) for service, verb in ROLE_REQUESTS[role]]
    publish += event_reader_subjects()
    # How far each read-model projector is behind (read only): what `rollout status` and the
    # viewer's stale-numbers banner read with a key (shared/stack/projections.py).
    publish += [
        subjects.js_api("CONSUMER", "INFO", durable.stream, durable.name)
        for durable in PROJECTIONS.values()
    ]
    # `whoami` asks the server who this connection is.
    publish.append(subjects.USER_INFO)
    deny = [
        subject
        for durable in SERVICE_DURABLES
        for subject in (
            subjects.js_api("CONSUMER", "MSG", "NEXT", subjects.EVENTS_STREAM, durable),
            subjects.js_api("CONSUMER", "CREATE", subjects.EVENTS_STREAM, durable),
            subjects.js_api("CONSUMER", "CREATE", subjects.EVENTS_STREAM, durable, ">"),
        )
    ]
    return {
        "publish": {"allow": publish, "deny": deny},
        # Replies come to the user's private inbox prefix only (see subjects.inbox_prefix).
        "subscribe": {"allow": [subjects.inbox_filter(user)]},
    }
