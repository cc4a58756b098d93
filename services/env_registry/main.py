"""Env registry service entry point."""

from __future__ import annotations

from faststream.nats import NatsBroker

from rollout.services.env_registry import handlers
from rollout.shared.bus.broker import make_broker
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.settings import Settings


def build_broker(settings: Settings) -> NatsBroker:
    """The registry's broker with its handlers."""
    broker = make_broker(settings)
    handlers.register(broker)
    return broker


async def serve(settings: Settings) -> None:
    """Run the env registry until cancelled."""

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        return build_broker(settings)

    await serve_service("env-registry", settings, build)
