"""How one learner replica is tuned from its environment: attempts per job and AckWait."""

from __future__ import annotations

from dataclasses import dataclass

from rollout.services.learner.jobs import MAX_DELIVER
from rollout.shared.service import durables
from rollout.shared.service.consumer import Consumer
from rollout.shared.settings import env_number

MAX_DELIVER_ENV = "ROLLOUT_LEARNER_MAX_DELIVER"
# Long jobs send in-progress acks; a dead learner's job comes back after AckWait.
ACK_WAIT_ENV = "ROLLOUT_LEARNER_ACK_WAIT_S"


@dataclass(frozen=True)
class Limits:
    """This replica's delivery limits: attempts per job, and how often a running job is acked."""

    max_deliver: int
    keepalive_s: float


def ack_wait_s() -> float:
    """How long a job may go without an in-progress ack before it is redelivered."""
    return max(1.0, env_number(ACK_WAIT_ENV, 60.0, unit="seconds"))


def max_deliver() -> int:
    """How many attempts a job gets before it fails (`ROLLOUT_LEARNER_MAX_DELIVER`, default 3)."""
    return int(env_number(MAX_DELIVER_ENV, MAX_DELIVER, whole=True, low=1))


def limits() -> Limits:
    """This replica's limits, read when it starts."""
    return Limits(max_deliver(), keepalive_s=ack_wait_s() / 3)


def consumers() -> list[Consumer]:
    """The job consumer (with this replica's AckWait) and the dead-lettered jobs' follower."""
    return [durables.LEARNER_JOBS.tuned(ack_wait_s=ack_wait_s()), durables.LEARNER_DEADLETTERS]
