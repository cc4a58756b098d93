"""Idempotent stream and consumer setup: safe to run on every start of every replica."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from rollout.shared import subjects
from rollout.shared.errors import RolloutError
from rollout.shared.observability import get_logger

# JetStream drops a second publish with the same Nats-Msg-Id inside this window.
DEDUP_WINDOW_S = 120.0

log = get_logger(__name__)

# JetStream's answers to more replicas than the servers can place: "replicas > 1 not
# supported in non-clustered mode" and "insufficient resources" (too few peers).
_REPLICA_ERRORS = (10074, 10023)
# How long a service waits for a cluster to answer its setup calls (see retry_api).
API_RETRY_S = 30.0
API_RETRY_PAUSE_S = 0.25

T = TypeVar("T")


def events_stream_config(replicas: int = 1) -> api.StreamConfig:
    """The append-only events stream: file storage, limits retention, dedup on, no erasing.

    Denying message deletes and purges makes the log the source of truth for good: no
    connection (a service's included) can rewrite history; `rollout admin rebuild` truncates
    the read models, never the stream. JetStream lets an update set these but never unset them.
    With `replicas` 3 (a cluster), an append is acknowledged once two servers hold it.
    """
    return api.StreamConfig(
        name=subjects.EVENTS_STREAM,
        subjects=[subjects.ALL_EVENTS],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        duplicate_window=DEDUP_WINDOW_S,
        allow_direct=True,
        deny_delete=True,
        deny_purge=True,
        num_replicas=replicas,
    )


def work_stream_config(replicas: int = 1) -> api.StreamConfig:
    """Work items: work-queue retention, one pull consumer per kind shared by replicas."""
    return api.StreamConfig(
        name=subjects.WORK_STREAM,
        subjects=[subjects.ALL_WORK],
        retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType.FILE,
        duplicate_window=DEDUP_WINDOW_S,
        num_replicas=replicas,
    )


async def ensure_stream(js: JetStreamContext, config: api.StreamConfig) -> api.StreamInfo:
    """Create the stream, or bring an existing one to this config (untouched when it matches).

    Only the stream manager's user may update a stream (see rollout.shared.auth.services):
    another service that finds an older config goes on with it (the update is refused, which
    nats-py sees as a timeout) and the manager brings it up to date when it starts. An update
    that only raises the replicas (R1 to R3 when a cluster forms) is applied by JetStream in
    place: the new peers catch up from the leader.
    """
    try:
        info = await retry_api(lambda: js.stream_info(config.name), config.name)
    except NotFoundError:
        try:
            return await retry_api(lambda: js.add_stream(config=config), config.name)
        except APIError as exc:
            # Another replica created it between our lookup and our add.
            if exc.err_code != 10058:
                raise _replica_error(config, exc) from exc
        info = await retry_api(lambda: js.stream_info(config.name), config.name)
    if config_matches(info.config, config):
        return info
    try:
        return await js.update_stream(config=config)
    except APIError as exc:
        raise _replica_error(config, exc) from exc
    except nats.errors.TimeoutError:
        log.warning(
            "stream config differs and this user may not update it; the tracker does",
            stream=config.name,
        )
        return info


async def retry_api(call: Callable[[], Awaitable[T]], what: str) -> T:
    """Run one JetStream API call, again while the servers cannot answer it yet.

    A cluster answers stream and consumer requests through its meta leader: while it elects
    one (just formed, or a server lost), or under load, a request times out or finds no
    responder and succeeds a moment later. Any other error is the caller's.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + API_RETRY_S
    while True:
        try:
            return await call()
        except (
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            ServiceUnavailableError,
        ) as exc:
            # Too few servers for the replicas is an answer, not a pause.
            if loop.time() > deadline or getattr(exc, "err_code", None) in _REPLICA_ERRORS:
                raise
            log.warning("jetstream api not answering yet; retrying", subject=what)
            await asyncio.sleep(API_RETRY_PAUSE_S)


def _replica_error(config: api.StreamConfig, exc: APIError) -> Exception:
    """A clear error for replicas the servers cannot place; any other API error unchanged."""
    if exc.err_code not in _REPLICA_ERRORS:
        return exc
    return RolloutError(
        f"stream {config.name}: JetStream cannot keep {config.num_replicas} replicas"
        f" ({exc.description})",
        problems=[
            "a stream needs as many JetStream servers as replicas: `rollout up --cluster 3`",
            "or lower ROLLOUT_STREAM_REPLICAS (1 on a single server)",
        ],
    )


def config_matches(current: api.StreamConfig, wanted: api.StreamConfig) -> bool:
    """True when every setting `wanted` names has that value in `current`."""
    have = current.as_dict()
    return all(have.get(key) == value for key, value in wanted.as_dict().items())


async def ensure_streams(js: JetStreamContext, replicas: int = 1) -> None:
    """Create or update every stream the platform uses, each with `replicas` copies."""
    await ensure_stream(js, events_stream_config(replicas))
    await ensure_stream(js, work_stream_config(replicas))


def pull_consumer_config(
    durable: str,
    filter_subject: str,
    *,
    ack_wait_s: float = 30.0,
    max_deliver: int = 5,
    max_ack_pending: int = 1000,
    deliver_all: bool = True,
) -> api.ConsumerConfig:
    """A durable pull consumer with explicit acks."""
    return api.ConsumerConfig(
        name=durable,
        durable_name=durable,
        filter_subject=filter_subject,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s,
        max_deliver=max_deliver,
        max_ack_pending=max_ack_pending,
        deliver_policy=api.DeliverPolicy.ALL if deliver_all else api.DeliverPolicy.NEW,
    )


async def ensure_consumer(
    js: JetStreamContext, stream: str, config: api.ConsumerConfig
) -> api.ConsumerInfo:
    """Create the durable consumer, or update it in place (add_consumer is create-or-update)."""
    return await retry_api(
        lambda: js.add_consumer(stream, config=config), f"{stream} {config.name}"
    )
