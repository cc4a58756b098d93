"""Actor service: one pull consumer shared by every replica (this is the work stealing)."""

from __future__ import annotations

from faststream.nats import NatsBroker

from rollout.services.actor import handlers, tuning
from rollout.shared.models.inference_server import server_setting
from rollout.shared.observability import get_logger
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings
from rollout.shared.stack.health import default_replica_id

log = get_logger(__name__)


def build_broker(settings: Settings, *, actor_id: str | None = None) -> NatsBroker:
    """The actor's broker: work items on the shared durable, policy updates to every replica,
    model checks from the tracker."""
    state = handlers.ActorState(
        settings=settings,
        actor_id=actor_id or default_replica_id(),
        keepalive_s=tuning.keepalive_s(),
    )
    return service_broker(
        settings,
        [handlers.POLICY_ROUTE, handlers.RUN_FAILED_ROUTE, handlers.CHECK_MODEL_ROUTE],
        consumers=[(tuning.consumer(), handlers.generate)],
        actor=state,
    )


async def serve(settings: Settings) -> None:
    """Run one actor replica until cancelled."""
    declared = tuning.consumer()  # a bad setting stops the replica before it connects
    server = server_setting()  # likewise a bad inference server (URL, allow-list, base)
    if server is not None:
        log.info(
            "trained LoRA policies generate through the inference server", server=server.url,
            base=server.base, adapters=str(server.adapter_dir),
        )  # fmt: skip

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        return build_broker(settings)

    await serve_service("actor", settings, build, consumers=[declared])
