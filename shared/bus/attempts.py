"""Deliveries of one work item: retry while attempts remain, then give up saying why."""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.msg import Msg

# Attempts per work item before a handler records the failure instead of retrying.
DEFAULT_MAX_DELIVER = 5


def gave_up(attempts: int, why: str) -> str:
    """The reason recorded after the last attempt: how many there were, and what the last met."""
    return f"gave up after {attempts} attempt{'s' if attempts != 1 else ''}: {why}"


def abandoned(delivery: int, replica: str) -> str:
    """Why a message is given up on at `delivery`: each earlier delivery ended without an
    answer, its `replica` (an actor, a verifier) gone before it finished."""
    return gave_up(
        delivery - 1,
        f"the {replica} replica handling it stopped before it finished (killed, out of memory, "
        "or an input that crashes it); see `rollout status` and the replica's log",
    )


@dataclass(frozen=True)
class Delivery:
    """This delivery of a work item: its number, and how many a handler allows."""

    number: int
    limit: int = DEFAULT_MAX_DELIVER

    @classmethod
    def of(cls, message: Msg, limit: int = DEFAULT_MAX_DELIVER) -> Delivery:
        """The delivery JetStream made of `message`."""
        return cls(message.metadata.num_delivered, limit)

    @property
    def last(self) -> bool:
        """True when no retry follows: the handler records the failure rather than raising."""
        return self.number >= self.limit

    def retry(self, exc: BaseException) -> None:
        """Raise `exc` again (the broker redelivers it with backoff) unless this is the last."""
        if not self.last:
            raise exc

    def gave_up(self, why: str) -> str:
        """The reason to record on the last attempt."""
        return gave_up(self.number, why)
