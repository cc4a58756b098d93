"""Calling a service over NATS request/reply, with errors the user can act on."""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import nats.errors
from nats.aio.client import Client

from rollout.shared import subjects
from rollout.shared.contracts.requests import Reply, Request
from rollout.shared.errors import RolloutError
from rollout.shared.service.throttle import RATE_LIMITED

# A request refused for its key's rate waits at most 2**this times the wait it was told.
MAX_BACKOFF_DOUBLINGS = 6


class NobodyAnswered(RolloutError):
    """No service subscribed to the request's subject: the request was never handled."""


class RequestTooLarge(RolloutError):
    """The request is larger than the server's max_payload: it was never sent."""

    def __init__(self, subject: str, size: int, limit: int) -> None:
        super().__init__(
            f"the request is {size:,} bytes, over the {limit:,} the server accepts in one "
            f"message ({subject})"
        )
        self.size, self.limit = size, limit


def connection_user(nc: Client) -> str | None:
    """The NATS user `nc` authenticates as (from its options, or its server URL), if any."""
    user = nc.options.get("user")
    if not user and nc.connected_url is not None:
        user = nc.connected_url.username
    return user or None


def service_subject(nc: Client, service: str, verb: str) -> str:
    """The subject of a request to `service` from this connection (with its caller, where
    the request is attributed: see subjects.attributed)."""
    return subjects.request(service, verb, connection_user(nc))


async def call(
    nc: Client, subject: str, request: Request, *, timeout_s: float = 30.0, retries: int = 0
) -> dict:
    """Send `request`, return the reply's data; raise RolloutError with the service's reasons.

    With `retries`, an unanswered request is sent again, unchanged: only for commands that are
    idempotent (they carry a client request id), where a repeat returns the first's result.
    """
    payload = request.model_dump_json().encode()
    limit = getattr(nc, "max_payload", 0)
    if limit and len(payload) > limit:
        # Said here, with the sizes, instead of nats' bare MaxPayloadError as a traceback.
        raise RequestTooLarge(subject, len(payload), limit)
    deadline = time.monotonic() + timeout_s
    for refusals in itertools.count(1):
        reply = await _send(nc, subject, payload, timeout_s=timeout_s, retries=retries)
        if reply.ok:
            return reply.data
        wait = reply.data.get("retryAfterS") if reply.error == RATE_LIMITED else None
        # Over the key's budget (shared/service/throttle.py): the request was answered
        # before it was handled, so it is resent unchanged once the budget allows, for as
        # long as the caller said it would wait. Many requests of one key refused at once are
        # told the same moment: each waits a random multiple of it, wider each time it is
        # refused again, so they come back spread out instead of together.
        if isinstance(wait, int | float) and wait >= 0:
            wait *= random.uniform(1.0, 2.0 ** min(refusals, MAX_BACKOFF_DOUBLINGS))
            if time.monotonic() + wait <= deadline:
                await asyncio.sleep(wait)
                continue
        raise RolloutError(reply.error or "request failed", problems=reply.problems)
    raise AssertionError("unreachable")


async def _send(
    nc: Client, subject: str, payload: bytes, *, timeout_s: float, retries: int
) -> Reply:
    for attempt in range(retries + 1):
        try:
            msg = await nc.request(subject, payload, timeout=timeout_s)
            break
        except nats.errors.NoRespondersError:
            # After an unanswered try, that try may still have been handled: not "never".
            error = NobodyAnswered if attempt == 0 else RolloutError
            raise error(
                f"no service answers {subject}",
                problems=[
                    # A stack that is up still has none while the supervisor restarts it.
                    f"its service ({_service_of(subject)}) is not running, or is restarting:"
                    " `rollout status` shows it",
                    "start the stack with `rollout up` (or `rollout serve <service>`)",
                ],
            ) from None
        except nats.errors.TimeoutError:
            if attempt == retries:
                raise RolloutError(f"{subject} did not answer within {timeout_s:.0f}s") from None
    return Reply.model_validate_json(msg.data)


def _service_of(subject: str) -> str:
    """The service token of a request subject (`rollout.req.<service>.<verb>...`)."""
    parts = subject.split(".")
    return parts[2] if len(parts) > 2 else subject
