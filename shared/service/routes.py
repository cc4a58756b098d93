"""A service's handlers as a FastStream router: request routes declared once, dependencies by name.

A service's `handlers.py` holds its handlers as plain module functions whose dependencies are
parameters annotated with a `Context` name (`CurrentBroker`, `Pool`, a replica's state:
FastStream fills them from the broker's context) and lists its request routes in `ROUTES`. Its `main.py` builds the broker with `service_broker`, which
includes a fresh router of those routes (each broker its own subscribers, so replicas can share
a process) and puts the dependencies in that broker's context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any

import asyncpg
from faststream import Context
from faststream.nats import NatsBroker, NatsRoute, NatsRouter

from rollout.shared import subjects
from rollout.shared.bus.attempts import DEFAULT_MAX_DELIVER
from rollout.shared.bus.broker import current_message, make_broker
from rollout.shared.service.consumer import Consumer
from rollout.shared.service.throttle import KeyThrottle
from rollout.shared.settings import Settings

# The broker a handler runs on (for its JetStream context), as a handler parameter.
CurrentBroker = Annotated[NatsBroker, Context("broker")]
# The service's Postgres pool, put in its broker's context as `pool`.
Pool = Annotated[asyncpg.Pool, Context("pool")]


def request_route(
    handler: Callable[..., Any],
    service: str,
    verb: str,
    *,
    queue: str,
    title: str | None = None,
    max_workers: int = 1,
) -> NatsRoute:
    """The route answering `service`'s `verb` requests (one queue group across replicas;
    `max_workers` requests at a time per replica, one unless the handler waits on others)."""
    return NatsRoute(
        handler,
        subjects.request_filter(service, verb),
        queue=queue,
        title=title or f"{service}/{verb}",
        max_workers=max_workers,
    )


def caller(broker: NatsBroker) -> str:
    """Who sent the request being handled: the user its subject names (every request a key
    may send is attributed: subjects.attributed; the server lets a user publish only under its
    own name)."""
    return subjects.caller_of(current_message(broker).raw_message.subject)


def service_broker(
    settings: Settings,
    routes: Iterable[NatsRoute] = (),
    *,
    consumers: Iterable[tuple[Consumer, Callable[..., Any]]] = (),
    max_deliver: int = DEFAULT_MAX_DELIVER,
    **dependencies: Any,
) -> NatsBroker:
    """A broker with `routes` on a router of its own, each (durable, handler) of `consumers`
    subscribed, and `dependencies` in its context (`max_deliver`: the attempts a failing
    message gets before it is dead-lettered).

    Built without dependencies it still describes the service (the AsyncAPI document).
    """
    routes = list(routes)
    broker = make_broker(settings, max_deliver=max_deliver)
    if routes and (throttle := KeyThrottle.from_settings()) is not None:
        # Before the routes are included: their subscribers take the broker's middlewares.
        broker.add_middleware(throttle)
    broker.include_router(NatsRouter(handlers=routes))
    for consumer, handler in consumers:
        # Durable pull consumers subscribe on the broker itself: through a router their pull
        # loop never fetched (FastStream 0.7).
        consumer.subscriber(broker)(handler)
    for name, value in dependencies.items():
        broker.context.set_global(name, value)
    return broker
