"""Env registry service entry point."""

from __future__ import annotations

import asyncio

from faststream.nats import NatsBroker

from rollout.services.env_registry import handlers
from rollout.shared.bus.broker import make_broker
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.observability import get_logger
from rollout.shared.settings import Settings, connect_nats

log = get_logger(__name__)


def build_broker(settings: Settings) -> NatsBroker:
    """The registry's broker with its handlers."""
    broker = make_broker(settings)
    handlers.register(broker)
    return broker


async def serve(settings: Settings) -> None:
    """Run the env registry until cancelled."""
    nc = await connect_nats(settings)
    try:
        await ensure_streams(nc.jetstream(), settings.stream_replicas)
    finally:
        await nc.close()
    broker = build_broker(settings)
    await broker.start()
    log.info("env registry started")
    try:
        await asyncio.Event().wait()
    finally:
        await broker.stop()
