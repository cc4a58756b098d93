"""How one actor replica is tuned from its environment: AckWait and work items at once."""

from __future__ import annotations

from rollout.shared.service import durables
from rollout.shared.service.consumer import Consumer
from rollout.shared.settings import env_number

# How long a silent replica holds a work item before another one gets it (in-progress acks
# keep a working replica's items); tests shorten it to see a dead replica's work move quickly.
# Read when the service starts (not at import), like the verifier's.
ACK_WAIT_ENV = "ROLLOUT_ACTOR_ACK_WAIT_S"
DEFAULT_ACK_WAIT_S = 30.0

# How many work items one replica takes per fetch and generates at once. Each has its own
# in-progress acks; while one waits on the broker, the model or the object store, the others
# run, so a replica is not idle between round trips. Few enough that a queue split across
# replicas stays shared out (a fetched item is held until it is done).
CONCURRENCY_ENV = "ROLLOUT_ACTOR_CONCURRENCY"
DEFAULT_CONCURRENCY = 4


def ack_wait_s() -> float:
    """The actors consumer's AckWait in seconds (ROLLOUT_ACTOR_ACK_WAIT_S, else 30)."""
    return env_number(ACK_WAIT_ENV, DEFAULT_ACK_WAIT_S, unit="seconds", above=0)


def keepalive_s() -> float:
    """How often a replica acks the work items it is still on (well inside AckWait)."""
    return min(10.0, ack_wait_s() / 3)


def concurrency() -> int:
    """Work items a replica generates at once (ROLLOUT_ACTOR_CONCURRENCY, else 4)."""
    return int(env_number(CONCURRENCY_ENV, DEFAULT_CONCURRENCY, whole=True, low=1))


def consumer() -> Consumer:
    """The actors' work consumer with this replica's AckWait and fetch size (its concurrency)."""
    return durables.ACTORS.tuned(ack_wait_s=ack_wait_s(), batch_size=concurrency())
