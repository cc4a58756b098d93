"""One FastStream NATS broker per service, with the dead-letter policy installed."""

from __future__ import annotations

import logging
from typing import Any

from faststream.nats import NatsBroker, NatsMessage, NatsToken, NatsUserPassword
from faststream.security import BaseSecurity
from nats.aio.client import Client
from nats.js import JetStreamContext

from rollout.shared.bus import batch_pull, fetch_timeouts
from rollout.shared.bus.attempts import DEFAULT_MAX_DELIVER
from rollout.shared.bus.deadletter import DeadLetterPolicy
from rollout.shared.settings import Settings, inbox_prefix_of, nats_tls_context


def _security(settings: Settings) -> BaseSecurity | None:
    tls = nats_tls_context(settings)
    if settings.nats_token:
        return NatsToken(settings.nats_token, ssl_context=tls)
    if settings.nats_user is not None:
        return NatsUserPassword(settings.nats_user, settings.nats_password or "", ssl_context=tls)
    return BaseSecurity(ssl_context=tls) if tls is not None else None


def _faststream_logger() -> logging.Logger:
    """FastStream's own log lines, warnings and errors only (they reach the root handlers)."""
    logger = logging.getLogger("rollout.faststream")
    logger.setLevel(logging.WARNING)
    return logger


class _PrivateInboxBroker(NatsBroker):
    """A broker whose pull subscriptions take their replies under the user's inbox prefix.

    FastStream gives every pull subscriber `_INBOX.` unless told otherwise, which a service's
    user may not subscribe to (see rollout.shared.auth.services).
    """

    def __init__(self, *args: Any, reply_prefix: str, **kwargs: Any) -> None:
        super().__init__(*args, inbox_prefix=reply_prefix, **kwargs)
        self._reply_prefix = f"{reply_prefix}.".encode()

    def subscriber(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Register a subscriber; pull ones fetch into this user's own inbox."""
        kwargs.setdefault("inbox_prefix", self._reply_prefix)
        return super().subscriber(*args, **kwargs)


def make_broker(settings: Settings, *, max_deliver: int = DEFAULT_MAX_DELIVER) -> NatsBroker:
    """A broker connected with the settings' credentials; failures retry, then dead-letter."""
    fetch_timeouts.install()  # an idle pull loop's empty poll is not an error
    batch_pull.install()  # a batch consumer takes what a fetch brings, without lingering
    holder: dict[str, NatsBroker] = {}

    def js() -> JetStreamContext:
        return holder["broker"].config.connection_state.stream

    prefix = inbox_prefix_of(settings)
    options: dict[str, Any] = {}
    if prefix:
        # A service's user may only read replies under its own inbox prefix.
        options["reply_prefix"] = prefix
    broker = (_PrivateInboxBroker if prefix else NatsBroker)(
        # Every server of a cluster: the connection fails over to another when one goes.
        settings.nats_servers,
        security=_security(settings),
        **options,
        middlewares=[DeadLetterPolicy(js, max_deliver=max_deliver)],
        connect_timeout=5,
        # A service rides out any NATS outage: with nats-py's default (60 attempts) the
        # connection closes for good and FastStream's pull loop spins on the closed connection.
        max_reconnect_attempts=-1,
        reconnect_time_wait=2.0,
        # FastStream's per-message access lines go to DEBUG and its task-supervisor chatter to
        # INFO; a logger that keeps only warnings lets our handlers say what matters.
        logger=_faststream_logger(),
        log_level=logging.DEBUG,
    )
    holder["broker"] = broker
    return broker


def jetstream(broker: NatsBroker) -> JetStreamContext:
    """The JetStream context of a started broker (for admin calls and direct publishes)."""
    return broker.config.connection_state.stream


def nats_client(broker: NatsBroker) -> Client:
    """The core NATS connection of a started broker (for requests to other services)."""
    return broker.config.connection_state.connection


def current_message(broker: NatsBroker) -> NatsMessage:
    """The message `broker` is handling in this task (read inside a subscriber).

    Not a `message: NatsMessage` handler argument: fast_depends resolves a context argument
    with a synchronous call it runs in a worker thread, a thread hop (and a task group) on
    every message; the context holds the same object.
    """
    message = broker.context.get_local("message")
    if message is None:
        raise RuntimeError("current_message() is only valid inside a message handler")
    return message
