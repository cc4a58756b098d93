"""Idempotent stream and consumer setup: safe to run on every start of every replica."""

from __future__ import annotations

import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from rollout.shared import subjects
from rollout.shared.observability import get_logger

# JetStream drops a second publish with the same Nats-Msg-Id inside this window.
DEDUP_WINDOW_S = 120.0

log = get_logger(__name__)


def events_stream_config() -> api.StreamConfig:
    """The append-only events stream: file storage, limits retention, dedup on, no erasing.

    Denying message deletes and purges makes the log the source of truth for good: no
    connection (a service's included) can rewrite history; `rollout admin rebuild` truncates
    the read models, never the stream. JetStream lets an update set these but never unset them.
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
    )


def work_stream_config() -> api.StreamConfig:
    """Work items: work-queue retention, one pull consumer per kind shared by replicas."""
    return api.StreamConfig(
        name=subjects.WORK_STREAM,
        subjects=[subjects.ALL_WORK],
        retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType.FILE,
        duplicate_window=DEDUP_WINDOW_S,
    )


async def ensure_stream(js: JetStreamContext, config: api.StreamConfig) -> api.StreamInfo:
    """Create the stream, or bring an existing one to this config (untouched when it matches).

    Only the stream manager's user may update a stream (see rollout.shared.auth.services):
    another service that finds an older config goes on with it (the update is refused, which
    nats-py sees as a timeout) and the manager brings it up to date when it starts.
    """
    try:
        info = await js.stream_info(config.name)
    except NotFoundError:
        try:
            return await js.add_stream(config=config)
        except BadRequestError as exc:
            # Another replica created it between our lookup and our add.
            if exc.err_code != 10058:
                raise
        info = await js.stream_info(config.name)
    if config_matches(info.config, config):
        return info
    try:
        return await js.update_stream(config=config)
    except nats.errors.TimeoutError:
        log.warning(
            "stream config differs and this user may not update it; the tracker does",
            stream=config.name,
        )
        return info


def config_matches(current: api.StreamConfig, wanted: api.StreamConfig) -> bool:
    """True when every setting `wanted` names has that value in `current`."""
    have = current.as_dict()
    return all(have.get(key) == value for key, value in wanted.as_dict().items())


async def ensure_streams(js: JetStreamContext) -> None:
    """Create or update every stream the platform uses."""
    await ensure_stream(js, events_stream_config())
    await ensure_stream(js, work_stream_config())


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
    return await js.add_consumer(stream, config=config)
