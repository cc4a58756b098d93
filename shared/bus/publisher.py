"""Publishing events: deterministic Nats-Msg-Id, many in flight, optimistic concurrency.

No message goes over the server's max_payload (1 MiB by default, as the connection reports
it): `publish` refuses one with a clear error, and `publish_fitted` splits a batch event into
as many parts as it takes, each named by the items it holds. With `group_by` a split falls
between groups (e.g. a task's samples, which a `ruler` verifier judges together in one call),
never inside one, unless that one group alone is over the limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from rollout.shared.bus import async_replies  # noqa: F401 (a refused publish fails at once)
from rollout.shared.contracts.envelope import CONTENT_TYPE, EventEnvelope
from rollout.shared.errors import RetrySignal, RolloutError

# JetStream's error code for a failed Nats-Expected-Last-Subject-Sequence check.
_WRONG_LAST_SEQUENCE = 10071
# Room kept under max_payload for the headers (Nats-Msg-Id, Rollout-Type, expected sequence,
# trace headers) that count against the same limit as the body.
HEADER_ROOM = 8 * 1024
# What a connection that has not yet read the server's INFO is assumed to allow (NATS' default).
DEFAULT_MAX_PAYLOAD = 1024 * 1024

T = TypeVar("T")
# Builds the event for items[start:end] of a batch (its id must name start and end).
BuildPart = Callable[[list[T], int, int], EventEnvelope]
# Replaces one item that alone is too large (size, budget) with one that fits, e.g. errored.
Shrink = Callable[[T, int, int], T]
# The group an item belongs to: a split never separates two adjacent items of one group.
GroupBy = Callable[[T], Hashable]
# Makes the expected last sequence hold for every subject matching this filter (nats-server
# 2.11+): a whole aggregate's history, not just the one event's subject.
EXPECTED_SUBJECT_HEADER = "Nats-Expected-Last-Subject-Sequence-Subject"
# How long a batch of async publishes may wait for its acks.
ACK_TIMEOUT_S = 30.0


class ConcurrencyConflict(RetrySignal):
    """Someone appended to the aggregate since we read it."""


class PayloadTooLarge(RolloutError):
    """An event is larger than the server's max_payload allows, and cannot be split further."""


def payload_budget(js: JetStreamContext) -> int:
    """The largest event body the connected server accepts, less room for the headers."""
    nc = getattr(js, "_nc", None)
    max_payload = getattr(nc, "max_payload", 0) or DEFAULT_MAX_PAYLOAD
    return max(1024, max_payload - HEADER_ROOM)


def fit_to_payload(
    items: Sequence[T],
    build: BuildPart[T],
    budget: int,
    *,
    shrink: Shrink[T] | None = None,
    group_by: GroupBy[T] | None = None,
) -> list[EventEnvelope]:
    """The events that carry `items` in order, each at most `budget` bytes encoded.

    A batch that does not fit is halved until every part does (with `group_by`, cut at the
    group boundary nearest the middle: a group is split only when it alone does not fit); an
    item too large on its own is given to `shrink` (without one, or when what it returns
    still does not fit, this raises PayloadTooLarge naming the sizes).
    """
    return [event for event, _ in _fit(items, build, budget, shrink, group_by)]


def _cut(work: Sequence[T], start: int, end: int, group_by: GroupBy[T] | None) -> int:
    """Where to split work[start:end]: the group boundary nearest its middle, else the middle."""
    middle = (start + end) // 2
    if group_by is None:
        return middle
    keys = [group_by(item) for item in work[start:end]]
    boundaries = [start + i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
    return min(boundaries, key=lambda b: abs(b - middle)) if boundaries else middle


def _fit(
    items: Sequence[T],
    build: BuildPart[T],
    budget: int,
    shrink: Shrink[T] | None,
    group_by: GroupBy[T] | None = None,
) -> list[tuple[EventEnvelope, bytes]]:
    """fit_to_payload's events with their encoding (so publishing does not encode twice)."""
    work = list(items)
    out: list[tuple[EventEnvelope, bytes]] = []

    def place(start: int, end: int) -> None:
        event = build(work[start:end], start, end)
        data = event.to_bytes()
        size = len(data)
        if size <= budget:
            out.append((event, data))
            return
        if end - start > 1:
            middle = _cut(work, start, end, group_by)
            place(start, middle)
            place(middle, end)
            return
        if shrink is not None:
            work[start] = shrink(work[start], size, budget)
            event = build(work[start:end], start, end)
            data = event.to_bytes()
            smaller = len(data)
            if smaller <= budget:
                out.append((event, data))
                return
            size = smaller
        raise PayloadTooLarge(
            f"{event.type} item {start} is {size} bytes encoded, over the {budget} bytes a "
            "message may carry on this server (max_payload less room for headers)",
            problems=["large values must go to the object store (claim check) first"],
        )

    if work:
        place(0, len(work))
    return out


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
    headers = {
        api.Header.MSG_ID: envelope.id,
        "Rollout-Type": envelope.type,
        "content-type": CONTENT_TYPE,
    }
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
        data: bytes | None = None,
    ) -> PublishResult:
        """Append one event; with `expected_last_subject_seq` the append is conditional.

        The expectation is on the event's own subject, or with `expected_subject` (a filter
        such as one aggregate's `rollout.evt.run.<id>.*`) on the newest message of any subject
        it matches: no event of the aggregate may have landed since the one we decided from.
        `data` is the envelope already encoded, when the caller has it.
        """
        data = envelope.to_bytes() if data is None else data
        budget = payload_budget(self._js)
        if len(data) > budget:
            # Said here, with the sizes, instead of nats' bare MaxPayloadError on every retry.
            raise PayloadTooLarge(
                f"{envelope.type} on {envelope.subject} is {len(data)} bytes encoded, over the "
                f"{budget} bytes a message may carry on this server",
                problems=["split the batch or claim-check large values (object store)"],
            )
        try:
            ack = await self._js.publish(
                envelope.subject,
                data,
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

    async def publish_fitted(
        self,
        items: Sequence[T],
        build: BuildPart[T],
        *,
        shrink: Shrink[T] | None = None,
        group_by: GroupBy[T] | None = None,
    ) -> list[PublishResult]:
        """Append a batch event in as many parts as the server's max_payload needs (see fit_to_payload)."""
        events = _fit(items, build, payload_budget(self._js), shrink, group_by)
        return [await self.publish(event, data=data) for event, data in events]

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
