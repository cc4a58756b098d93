"""One FastStream NATS broker per service, with the dead-letter policy installed."""

from __future__ import annotations

from faststream.nats import NatsBroker
from nats.js import JetStreamContext
from rollout.shared.bus.deadletter import DEFAULT_MAX_DELIVER, DeadLetterPolicy
from rollout.shared.settings import Settings, nats_connect_kwargs


def make_broker(settings: Settings, *, max_deliver: int = DEFAULT_MAX_DELIVER) -> NatsBroker:
    """A broker connected with the settings' credentials; failures retry, then dead-letter."""
    holder: dict[str, NatsBroker] = {}

    def js() -> JetStreamContext:
        return holder["broker"].config.connection_state.stream

    broker = NatsBroker(
        **nats_connect_kwargs(settings),
        middlewares=[DeadLetterPolicy(js, max_deliver=max_deliver)],
        connect_timeout=5,
    )
    holder["broker"] = broker
    return broker


def jetstream(broker: NatsBroker) -> JetStreamContext:
    """The JetStream context of a started broker (for admin calls and direct publishes)."""
    return broker.config.connection_state.stream
