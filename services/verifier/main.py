"""Verifier service: scores every rollout.generated batch and emits one rollout.scored batch."""

from __future__ import annotations

from faststream.nats import NatsBroker

from rollout.services.verifier import handlers
from rollout.shared.service import durables
from rollout.shared.service.bootstrap import ServiceRuntime, serve_service
from rollout.shared.service.consumer import Consumer
from rollout.shared.service.routes import service_broker
from rollout.shared.settings import Settings, env_number

DURABLE = durables.VERIFIER.name
GENERATED = durables.VERIFIER.filter
# How long a silent verifier holds a generated batch before another replica gets it. While it
# scores (sandboxed test suites can take minutes) it sends in-progress acks, so a long batch
# is not redelivered; tests shorten the wait to show that.
ACK_WAIT_ENV = "ROLLOUT_VERIFIER_ACK_WAIT_S"
DEFAULT_ACK_WAIT_S = 60.0


def ack_wait_s() -> float:
    """The verifier consumer's AckWait in seconds (ROLLOUT_VERIFIER_ACK_WAIT_S, else 60)."""
    return env_number(ACK_WAIT_ENV, DEFAULT_ACK_WAIT_S, unit="seconds", above=0)


def consumer() -> Consumer:
    """The verifier's consumer of generated batches, with this replica's AckWait."""
    return durables.VERIFIER.tuned(ack_wait_s=ack_wait_s())


def build_broker(settings: Settings) -> NatsBroker:
    """The verifier's broker: its batch handler on its durable, with this replica's state."""
    state = handlers.VerifierState(settings=settings, keepalive_s=min(10.0, ack_wait_s() / 3))
    return service_broker(settings, consumers=[(consumer(), handlers.score_batch)], verifier=state)


async def serve(settings: Settings) -> None:
    """Run one verifier replica until cancelled."""
    declared = consumer()  # a bad setting stops the replica before it connects

    async def build(runtime: ServiceRuntime) -> NatsBroker:
        return build_broker(settings)

    await serve_service("verifier", settings, build, consumers=[declared])
