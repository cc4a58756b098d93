"""Publishing events: deterministic Nats-Msg-Id, many in flight, optimistic concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from rollout.errors import RolloutError
from rollout.shared.contracts.envelope import EventEnvelope

# JetStream's error code for a failed Nats-Expected-Last-Subject-Sequence check.
_WRONG_LAST_SEQUENCE = 10071
# Makes the expected last sequence hold for every subject matching this filter (nats-server
# 2.11+): a whole aggregate's history, not just the one event's subject.
EXPECTED_SUBJECT_HEADER = "Nats-Expected-Last-Subject-Sequence-Subject"
# How long a batch of async publishes may wait for its acks.
ACK_TIMEOUT_S = 30.0


class ConcurrencyConflict(RolloutError):
    """Someone appended to the aggregate since we read it."""


class PublishResult:
    """Where an event landed, and whether JetStream saw it before (duplicate)."""

    __slots__ = ("seq", "duplicate", "event_id")

    def __init__(self, event_id: str, seq: int, duplicate: bool) -> None:
        self.event_id = event_id
        self.seq = seq
        self.duplicate = duplicate


def _headers(
    envelope: EventEnvelope,
    expected_last_subject_seq: int | None,
    expected_subject: str | None = None,
) -> dict[str, str]:
    headers = {api.Header.MSG_ID: envelope.id, "Rollout-Type": envelope.type}
    if expected_last_subject_seq is not None:
        headers[api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected_last_subject_seq)
        if expected_subject is not None:
            headers[EXPECTED_SUBJECT_HEADER] = expected_subject
    return headers


class EventPublisher:
    """Appends events to the events stream."""

    def __init__(self, js: JetStreamContext, *, max_in_flight: int = 256) -> None:
        self._js = js
        self._max_in_flight = max_in_flight

    async def publish(
        self,
        envelope: EventEnvelope,
        *,
        expected_last_subject_seq: int | None = None,
        expected_subject: str | None = None,
    ) -> PublishResult:
        """Append one event; with `expected_last_subject_seq` the append is conditional.

        The expectation is on the event's own subject, or with `expected_subject` (a filter
        such as one aggregate's `rollout.evt.run.<id>.*`) on the newest message of any subject
        it matches: no event of the aggregate may have landed since the one we decided from.
        """
        try:
            ack = await self._js.publish(
                envelope.subject,
                envelope.to_bytes(),
                headers=_headers(envelope, expected_last_subject_seq, expected_subject),
            )
        except APIError as exc:
            if exc.err_code == _WRONG_LAST_SEQUENCE:
                raise ConcurrencyConflict(
                    f"conflict appending {envelope.type} to {expected_subject or envelope.subject}"
                    f": expected last subject sequence {expected_last_subject_seq}, but the "
                    f"aggregate has moved on ({exc.description})"
                ) from None
            raise
        return PublishResult(envelope.id, ack.seq, bool(ack.duplicate))

    async def publish_batch(self, envelopes: Sequence[EventEnvelope]) -> list[PublishResult]:
        """Append many events with up to `max_in_flight` publishes awaiting their acks."""
        results: list[PublishResult] = []
        for start in range(0, len(envelopes), self._max_in_flight):
            chunk = envelopes[start : start + self._max_in_flight]
            futures = [
                await self._js.publish_async(e.subject, e.to_bytes(), headers=_headers(e, None))
                for e in chunk
            ]
            # nats-py's async publishes wait for their acks without a limit: one lost ack would
            # hang the caller for good, so the batch gets one.
            acks = await asyncio.wait_for(asyncio.gather(*futures), ACK_TIMEOUT_S)
            results.extend(
                PublishResult(e.id, ack.seq, bool(ack.duplicate))
                for e, ack in zip(chunk, acks, strict=True)
            )
        return results
