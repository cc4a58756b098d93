"""Env registry service: validates, versions and serves environment specs (events only)."""

from __future__ import annotations

from faststream.nats import NatsBroker

from rollout.services.env_registry import handlers
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings


def build_broker(settings: Settings) -> NatsBroker:
    """The registry's broker with its request routes."""
    return service_broker(settings, handlers.ROUTES)


async def serve(settings: Settings) -> None:
    """Run the env registry until cancelled."""

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        return build_broker(settings)

    await serve_service("env-registry", settings, build)
