"""Buffer service: keeps scored rollouts and serves SFT sets, DPO pairs and GRPO groups.

It reads the events stream in order through one durable consumer (replicas share it) and
applies run requests, generated batches and their verdicts with a ProjectionRunner: the
effect and the stream position commit together, so a redelivered event changes nothing.
"""

from __future__ import annotations

from faststream.nats import NatsBroker

from rollout.services.buffer import handlers
from rollout.services.buffer.projection import BufferProjection, inline_bytes_from_env, wanted
from rollout.services.buffer.queries import CATCH_UP_S, BufferQueries
from rollout.shared.objectstore import ObjectStore
from rollout.shared.observability import get_logger
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.projection_consumer import subscribe_projection
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings
from rollout.shared.store.projection import ProjectionRunner

DURABLE = durables.BUFFER.name

log = get_logger(__name__)


def build_broker(settings: Settings, runner: ProjectionRunner | None = None) -> NatsBroker:
    """The buffer's broker: the events consumer (applied by `runner`) and the request routes."""
    broker = service_broker(settings, handlers.ROUTES)
    # The tracker records the dead letter of an invalid event; the buffer only moves past it.
    subscribe_projection(broker, durables.BUFFER, runner, wanted=wanted)  # type: ignore[arg-type]
    return broker


async def serve(
    settings: Settings,
    *,
    inline_bytes: int | None = None,
    store: ObjectStore | None = None,
    catch_up_s: float = CATCH_UP_S,
) -> None:
    """Run one buffer replica until cancelled (`catch_up_s`: how long a query waits to catch up)."""
    threshold = inline_bytes_from_env() if inline_bytes is None else inline_bytes

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        pool = runtime.database()
        objects = store or runtime.object_store()
        projection = BufferProjection(objects, inline_bytes=threshold)
        runner = ProjectionRunner(pool, projection, contiguous=True)
        broker = build_broker(settings, runner)
        queries = BufferQueries.on_broker(pool, objects, broker, runner, catch_up_s=catch_up_s)
        broker.context.set_global("queries", queries)
        log.info("buffer started", position=await runner.position(), inline_bytes=threshold)
        return broker

    await serve_service("buffer", settings, build, consumers=[durables.BUFFER], database=True)
