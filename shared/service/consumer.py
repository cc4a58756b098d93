"""One durable pull consumer, declared once: its JetStream config, subscriber and permissions.

A `Consumer` names the stream, the durable and the filter (what a service's NATS permissions
are derived from: rollout.shared.auth.services) and how it is consumed (AckWait, MaxDeliver,
MaxAckPending, fetch size, FastStream's ack policy). `config()` is what the bootstrap ensures
on the server before a broker starts; `subscriber(broker)` registers the FastStream handler
on that same durable. A service may tune delivery settings at start (an env override of its
AckWait) with `tuned`, never the identity, so permissions and consumers cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from nats.js import api

from rollout.shared.bus.attempts import DEFAULT_MAX_DELIVER
from rollout.shared.bus.streams import pull_consumer_config

# What permissions are derived from: a tuned consumer keeps these.
IDENTITY = ("stream", "name", "filter")


@dataclass(frozen=True)
class Consumer:
    """A durable pull consumer: where it reads, how it is delivered, how it is handled."""

    stream: str
    name: str
    filter: str
    title: str
    description: str | None = None
    # Server side: how long a delivery waits for an ack, how often it is redelivered (-1: for
    # ever), and how many deliveries may be unacked at once.
    ack_wait_s: float = 30.0
    # The handlers dead-letter on their last delivery by this same constant: tied, not copied.
    max_deliver: int = DEFAULT_MAX_DELIVER
    max_ack_pending: int = 1000
    # Client side: messages per fetch, how long a fetch waits, and whether the handler gets
    # the whole fetch at once (a list of messages) or one message per call.
    batch_size: int = 1
    pull_timeout_s: float = 1.0
    batch: bool = False
    ack_policy: AckPolicy = AckPolicy.NACK_ON_ERROR

    def tuned(self, **changes: Any) -> Consumer:
        """The same durable with other delivery settings (an identity change is refused)."""
        fixed = sorted(set(changes) & set(IDENTITY))
        if fixed:
            raise ValueError(f"consumer {self.name}: {', '.join(fixed)} cannot be tuned")
        return dataclasses.replace(self, **changes)

    def config(self) -> api.ConsumerConfig:
        """The JetStream consumer config the bootstrap creates or updates."""
        return pull_consumer_config(
            self.name,
            self.filter,
            ack_wait_s=self.ack_wait_s,
            max_deliver=self.max_deliver,
            max_ack_pending=self.max_ack_pending,
        )

    def _options(self) -> dict[str, Any]:
        return {
            "stream": JStream(self.stream, declare=False),
            "durable": self.name,
            "pull_sub": PullSub(
                batch_size=self.batch_size, timeout=self.pull_timeout_s, batch=self.batch
            ),
            "ack_policy": self.ack_policy,
            "title": self.title,
            "description": self.description,
        }

    def subscriber(self, broker: NatsBroker, **options: Any) -> Callable[[Any], Any]:
        """Register a FastStream handler on this durable (a decorator, like broker.subscriber)."""
        return broker.subscriber(self.filter, **self._options(), **options)  # type: ignore[no-any-return]
