"""Calling a service over NATS request/reply, with errors the user can act on."""

from __future__ import annotations

import nats.errors
from nats.aio.client import Client

from rollout.errors import RolloutError
from rollout.shared.contracts.requests import Reply, Request


async def call(nc: Client, subject: str, request: Request, *, timeout_s: float = 30.0) -> dict:
    """Send `request`, return the reply's data; raise RolloutError with the service's reasons."""
    try:
        msg = await nc.request(subject, request.model_dump_json().encode(), timeout=timeout_s)
    except nats.errors.NoRespondersError:
        raise RolloutError(
            f"no service answers {subject}",
            problems=["start the stack with `rollout up` (or `rollout serve <service>`)"],
        ) from None
    except nats.errors.TimeoutError:
        raise RolloutError(f"{subject} did not answer within {timeout_s:.0f}s") from None
    reply = Reply.model_validate_json(msg.data)
    if not reply.ok:
        raise RolloutError(reply.error or "request failed", problems=reply.problems)
    return reply.data
