"""Actor service: one pull consumer shared by every replica (this is the work stealing)."""

from __future__ import annotations

from faststream.nats import NatsBroker

from rollout.services.actor import handlers
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.consumer import Consumer
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings, env_number
from rollout.shared.stack.health import default_replica_id

DURABLE = durables.ACTORS.name
# How long a silent replica holds a work item before another one gets it (in-progress acks
# keep a working replica's items); tests shorten it to see a dead replica's work move quickly.
# Read when the service starts (not at import), like the verifier's.
ACK_WAIT_ENV = "ROLLOUT_ACTOR_ACK_WAIT_S"
DEFAULT_ACK_WAIT_S = 30.0


def ack_wait_s() -> float:
    """The actors consumer's AckWait in seconds (ROLLOUT_ACTOR_ACK_WAIT_S, else 30)."""
    return env_number(ACK_WAIT_ENV, DEFAULT_ACK_WAIT_S, unit="seconds", above=0)


# How many work items one replica takes per fetch and generates at once. Each has its own
# in-progress acks; while one waits on the broker, the model or the object store, the others
# run, so a replica is not idle between round trips. Few enough that a queue split across
# replicas stays shared out (a fetched item is held until it is done).
CONCURRENCY_ENV = "ROLLOUT_ACTOR_CONCURRENCY"
DEFAULT_CONCURRENCY = 4


def concurrency() -> int:
    """Work items a replica generates at once (ROLLOUT_ACTOR_CONCURRENCY, else 4)."""
    return int(env_number(CONCURRENCY_ENV, DEFAULT_CONCURRENCY, whole=True, low=1))


def consumer() -> Consumer:
    """The actors' work consumer with this replica's AckWait and fetch size (its concurrency)."""
    return durables.ACTORS.tuned(ack_wait_s=ack_wait_s(), batch_size=concurrency())


def build_broker(settings: Settings, *, actor_id: str | None = None) -> NatsBroker:
    """The actor's broker: work items on the shared durable, policy updates to every replica."""
    state = handlers.ActorState(
        settings=settings,
        actor_id=actor_id or default_replica_id(),
        keepalive_s=min(10.0, ack_wait_s() / 3),
    )
    return service_broker(
        settings,
        [handlers.POLICY_ROUTE],
        consumers=[(consumer(), handlers.generate)],
        actor=state,
    )


async def serve(settings: Settings) -> None:
    """Run one actor replica until cancelled."""
    declared = consumer()  # a bad setting stops the replica before it connects

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        return build_broker(settings)

    await serve_service("actor", settings, build, consumers=[declared])
