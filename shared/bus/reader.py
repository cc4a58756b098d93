"""Reading the events stream from a position: replays, rebuilds, follows, `rollout events`.

A read holds no consumer. It asks the stream for its stored messages in batches (JetStream's
batched direct get, `$JS.API.DIRECT.GET.<stream>` with `batch` and `next_by_subj`, nats-server
2.11+), which any server holding the stream answers from its store; a followed read asks
again for what came after its last message, pausing while nothing new comes. So no read, an
API key's or a service's, counts towards the stream's consumers (nats-server refuses every
consumer create on a stream past its limit, the services' durables included, and a key cannot
delete what it made), and keys may not create consumers on the events stream at all
(shared/auth/services.py: event_reader_subjects). docs/scaling.md, "Reads hold no consumer".
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import heapq
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from rollout.shared import subjects
from rollout.shared.bus.cancels import raise_if_cancelled

# How long a batch waits for its next reply before it is asked again (a lost reply, a server
# that went away mid-batch), and how long a read goes without progress before it gives up.
REPLY_WAIT_S = 5.0
LATE_DELIVERY_LIMIT_S = 30.0
# A batch ends after the message that passes this many bytes (a big event still comes whole).
BATCH_MAX_BYTES = 4 * 1024 * 1024
# A followed read with nothing new asks again after the shortest pause, doubling to the
# longest: an event is seen within the longest pause, and an idle follower costs a few small
# requests a second.
FOLLOW_PAUSE_MIN_S = 0.02
FOLLOW_PAUSE_MAX_S = 0.25

# The headers a direct get's replies carry (ADR-31).
_STATUS = api.Header.STATUS.value
_DESCRIPTION = api.Header.DESCRIPTION.value
_PENDING = "Nats-Num-Pending"
_STREAM = "Nats-Stream"
_SUBJECT = "Nats-Subject"
_SEQUENCE = "Nats-Sequence"
_TIMESTAMP = "Nats-Time-Stamp"


@dataclass(frozen=True)
class StoredEvent:
    """One stored message of a stream, as a read yields it.

    `metadata.sequence.stream` is its position in the stream and `metadata.num_pending` how
    many messages matching the read's filter followed it when it was read, as on a consumer's
    message (the consumer fields are empty: there is none).
    """

    subject: str
    data: bytes
    headers: dict[str, str]
    metadata: Msg.Metadata

    @property
    def seq(self) -> int:
        """The stream sequence (`metadata.sequence.stream`)."""
        return self.metadata.sequence.stream


async def last_sequence(js: JetStreamContext, stream: str = subjects.EVENTS_STREAM) -> int:
    """The stream's last sequence number (0 when empty)."""
    info = await js.stream_info(stream)
    return info.state.last_seq


async def read_events(
    js: JetStreamContext,
    filter_subject: str | list[str] = subjects.ALL_EVENTS,
    *,
    start_seq: int = 1,
    follow: bool = False,
    batch: int = 256,
    stream: str = subjects.EVENTS_STREAM,
) -> AsyncIterator[StoredEvent]:
    """Yield stored messages in order from `start_seq`; with `follow`, keep waiting for new ones.

    Without `follow` the read ends at the stream's last message when it was called.
    `filter_subject` may be a list of filters (one aggregate's chosen event types, say): each is
    read on its own and the reads are merged in stream order.
    """
    info = await js.stream_info(stream)
    stop_at = info.state.last_seq
    if stop_at < max(start_seq, 1) and not follow:
        return
    filters = filter_subject if isinstance(filter_subject, list) else [filter_subject]
    # Every server holding the stream answers direct gets. A replica may lag its leader for a
    # moment; with one, a batch's "nothing more" is checked with the leader before a read ends.
    replicated = (info.config.num_replicas or 1) > 1
    getter = _DirectGet(js, stream, batch)
    await getter.open()
    try:
        cursors = [_Cursor(getter, f, max(start_seq, 1), replicated) for f in filters]
        if follow:
            reads = _follow(cursors)
        elif len(cursors) == 1:
            reads = cursors[0].up_to(stop_at)
        else:
            reads = _merged([c.up_to(stop_at) for c in cursors])
        async with aclosing(reads) as messages:
            async for msg in messages:
                yield msg
    finally:
        await getter.close()


class _DirectGet:
    """Batched direct gets of one stream on one connection, each answered to its own inbox."""

    def __init__(self, js: JetStreamContext, stream: str, batch: int) -> None:
        self.js = js
        self.nc: NATS = js._nc
        self.stream = stream
        self.batch = batch
        self.subject = subjects.js_api("DIRECT", "GET", stream)
        self.inbox = self.nc.new_inbox()
        self.sub: Subscription | None = None
        self.asked = 0
        # The replies of each request under way; a late reply to one asked again is dropped.
        self.replies: dict[str, asyncio.Queue[Msg]] = {}

    async def open(self) -> None:
        self.sub = await self.nc.subscribe(f"{self.inbox}.*", cb=self._deliver)

    async def close(self) -> None:
        if self.sub is not None:
            with contextlib.suppress(nats.errors.ConnectionClosedError):
                await self.sub.unsubscribe()

    async def _deliver(self, msg: Msg) -> None:
        if (queue := self.replies.get(msg.subject)) is not None:
            queue.put_nowait(msg)

    async def get(self, filter_subject: str, seq: int) -> tuple[list[StoredEvent], int]:
        """The messages matching `filter_subject` from `seq`, one batch, and how many more
        matched when it ended (0: none yet)."""
        loop = asyncio.get_running_loop()
        gave_up_at = loop.time() + LATE_DELIVERY_LIMIT_S
        request = {
            "seq": seq,
            "next_by_subj": filter_subject,
            "batch": self.batch,
            "max_bytes": BATCH_MAX_BYTES,
        }
        got: list[StoredEvent] = []
        while True:
            self.asked += 1
            reply = f"{self.inbox}.{self.asked}"
            queue = self.replies[reply] = asyncio.Queue()
            request["seq"] = got[-1].seq + 1 if got else seq
            try:
                await self.nc.publish(self.subject, json.dumps(request).encode(), reply=reply)
                while True:
                    msg = await asyncio.wait_for(queue.get(), REPLY_WAIT_S)
                    # A reply that came with a cancel: wait_for (3.11) dropped the cancel.
                    raise_if_cancelled()
                    status = (msg.headers or {}).get(_STATUS)
                    if status is None:
                        got.append(_stored(msg))
                    elif status == "204":  # end of batch
                        return got, int(msg.headers.get(_PENDING) or 0)
                    elif status == "404":  # nothing (more) matches
                        return got, 0
                    else:
                        _raise_status(self.stream, msg)
            except TimeoutError:
                # No server answered in time, or a reply was lost: ask again from the last
                # message that came; the read is short only if nothing comes for long.
                if loop.time() >= gave_up_at:
                    raise ConnectionError(
                        f"reading {filter_subject} from {self.stream}: no answer to a direct "
                        f"get within {LATE_DELIVERY_LIMIT_S:.0f} s"
                    ) from None
            finally:
                del self.replies[reply]

    async def leader_has(self, filter_subject: str, seq: int) -> int | None:
        """The sequence of the first message matching `filter_subject` from `seq`, as the
        stream's leader holds it (None: none)."""
        try:
            found = await self.js.get_msg(self.stream, seq=seq, subject=filter_subject, next=True)
        except NotFoundError:
            return None
        return found.seq


class _Cursor:
    """One filter's place in a read: the next sequence to ask for."""

    def __init__(self, getter: _DirectGet, filter_subject: str, seq: int, replicated: bool):
        self.getter = getter
        self.filter = filter_subject
        self.next = seq
        self.replicated = replicated

    async def more(self) -> tuple[list[StoredEvent], int]:
        """The next batch from this filter's place, and how many matched after it."""
        got, pending = await self.getter.get(self.filter, self.next)
        if got:
            self.next = got[-1].seq + 1
        return got, pending

    async def up_to(self, stop_at: int) -> AsyncGenerator[StoredEvent, None]:
        """Every message of this filter up to stream position `stop_at`."""
        while self.next <= stop_at:
            got, pending = await self.more()
            for msg in got:
                if msg.seq > stop_at:
                    return
                yield msg
            if pending:
                continue
            if not self.replicated:
                return
            # The server that answered may lag the leader: the leader says whether more is due.
            due = await self.getter.leader_has(self.filter, self.next)
            if due is None or due > stop_at:
                return
            if not got:
                await asyncio.sleep(FOLLOW_PAUSE_MIN_S)


async def _merged(
    reads: list[AsyncGenerator[StoredEvent, None]],
) -> AsyncGenerator[StoredEvent, None]:
    """Several reads' messages in stream order (each read is in order)."""
    try:
        # Each read's first batch is asked for at once: most reads are one batch each.
        firsts = await asyncio.gather(*(anext(read, None) for read in reads))
        heads = [(msg.seq, index, msg) for index, msg in enumerate(firsts) if msg is not None]
        heapq.heapify(heads)
        while heads:
            _, index, msg = heapq.heappop(heads)
            yield msg
            following = await anext(reads[index], None)
            if following is not None:
                heapq.heappush(heads, (following.seq, index, following))
    finally:
        for read in reads:
            await read.aclose()


async def _follow(cursors: list[_Cursor]) -> AsyncGenerator[StoredEvent, None]:
    """Every message of the cursors' filters from their places on, as they come, in order.

    Several filters are read round by round: each one's new messages, merged. A followed list
    of filters is meant for a few events (a job's endings), not for a long backlog.
    """
    pause = FOLLOW_PAUSE_MIN_S
    while True:
        found = 0
        if len(cursors) == 1:
            async for msg in _available(cursors[0]):
                found += 1
                yield msg
        else:
            round_: list[StoredEvent] = []
            for cursor in cursors:
                round_ += [msg async for msg in _available(cursor)]
            for msg in sorted(round_, key=lambda m: m.seq):
                found += 1
                yield msg
        # A follow never ends by itself: a cancel a request swallowed must end it here.
        raise_if_cancelled()
        if found:
            pause = FOLLOW_PAUSE_MIN_S
            continue
        await asyncio.sleep(pause)
        pause = min(pause * 2, FOLLOW_PAUSE_MAX_S)


async def _available(cursor: _Cursor) -> AsyncIterator[StoredEvent]:
    """A cursor's messages stored now, batch after batch."""
    while True:
        got, pending = await cursor.more()
        for msg in got:
            yield msg
        if not (got and pending):
            return


def _stored(msg: Msg) -> StoredEvent:
    headers = msg.headers or {}
    stamp = headers.get(_TIMESTAMP) or ""
    return StoredEvent(
        subject=headers.get(_SUBJECT) or msg.subject,
        data=msg.data,
        headers=headers,
        metadata=Msg.Metadata(
            sequence=Msg.Metadata.SequencePair(consumer=0, stream=int(headers[_SEQUENCE])),
            num_pending=int(headers.get(_PENDING) or 0),
            num_delivered=1,
            timestamp=_parse_time(stamp),
            stream=headers.get(_STREAM) or "",
            consumer="",
        ),
    )


def _parse_time(stamp: str) -> datetime.datetime:
    """A direct get's `Nats-Time-Stamp` (RFC 3339 with nanoseconds) as an aware datetime."""
    text = stamp.replace("Z", "+00:00")
    if "." in text:
        whole, rest = text.split(".", 1)
        digits = "".join(c for c in rest if c.isdigit())
        text = f"{whole}.{digits[:6]}{rest[len(digits) :]}"
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return datetime.datetime.fromtimestamp(0, datetime.UTC)


def _raise_status(stream: str, msg: Msg) -> None:
    headers = msg.headers or {}
    status = headers.get(_STATUS)
    description = headers.get(_DESCRIPTION) or ""
    if status == "503":
        raise nats.errors.NoRespondersError
    raise APIError(code=int(status or 0), description=f"direct get on {stream}: {description}")
