"""The bus on a real nats-server: batches, dedup, optimistic concurrency, dead letters."""

from __future__ import annotations

import asyncio
import json
import random

import nats.errors
import pytest
from faststream.nats import JStream, PullSub
from nats.js import api
from nats.js.errors import APIError
from waiting import wait_until

from rollout.shared import subjects
from rollout.shared.bus.broker import make_broker
from rollout.shared.bus.publisher import ConcurrencyConflict, EventPublisher
from rollout.shared.bus.reader import read_events
from rollout.shared.bus.streams import (
    ensure_consumer,
    ensure_streams,
    pull_consumer_config,
)
from rollout.shared.contracts import EventEnvelope, new_id
from rollout.shared.contracts.events import DeadLettered, RunFailed

DEADLINE_S = 20.0


def failed(run_id: str, i: int, reason: str = "x") -> EventEnvelope:
    return EventEnvelope.new(
        RunFailed(run_id=run_id, reason=reason), aggregate_id=run_id, id_parts=(run_id, i)
    )


async def collect(js, filter_subject: str) -> list[EventEnvelope]:
    return [EventEnvelope.from_bytes(m.data) async for m in read_events(js, filter_subject)]


async def test_stream_setup_is_idempotent(nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    await ensure_streams(js)
    info = await js.stream_info(subjects.EVENTS_STREAM)
    assert info.config.duplicate_window == pytest.approx(120.0)
    work = await js.stream_info(subjects.WORK_STREAM)
    assert work.config.retention == "workqueue"


async def test_batch_round_trip_and_duplicates_are_stored_once(nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    run_id = new_id()
    batch = [failed(run_id, i, reason=f"r{i}") for i in range(200)]
    results = await EventPublisher(js, max_in_flight=64).publish_batch(batch)
    assert [r.duplicate for r in results] == [False] * 200
    again = await EventPublisher(js).publish(batch[7])
    assert again.duplicate and again.seq == results[7].seq
    retried = await EventPublisher(js).publish_batch(batch[:10])
    assert all(r.duplicate for r in retried)

    stored = await collect(js, subjects.run_events(run_id))
    assert [e.id for e in stored] == [e.id for e in batch]
    assert [e.body().reason for e in stored] == [f"r{i}" for i in range(200)]


async def test_expected_last_subject_sequence_conflict_is_clear(nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    run_id = new_id()
    pub = EventPublisher(js)
    first = await pub.publish(failed(run_id, 0), expected_last_subject_seq=0)
    await pub.publish(failed(run_id, 1), expected_last_subject_seq=first.seq)
    with pytest.raises(ConcurrencyConflict) as caught:
        await pub.publish(failed(run_id, 2), expected_last_subject_seq=first.seq)
    message = str(caught.value)
    assert "expected last subject sequence" in message and run_id in message


async def test_poison_message_is_dead_lettered_and_next_is_handled(settings, nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    key = new_id()
    subject = subjects.work("bustest", key)
    durable = f"bustest-{key}"
    await ensure_consumer(js, subjects.WORK_STREAM, pull_consumer_config(durable, subject))

    handled: list[str] = []
    broker = make_broker(settings)

    @broker.subscriber(
        subject,
        stream=JStream(subjects.WORK_STREAM, declare=False),
        durable=durable,
        pull_sub=PullSub(batch_size=4, timeout=0.5),
    )
    async def handle(event: EventEnvelope) -> None:
        handled.append(event.body().reason)

    await js.publish(subject, b'{"not": "an envelope"}')
    await js.publish(subject, failed(key, 1, reason="good").to_bytes())
    async with broker:
        await broker.start()
        await wait_until(lambda: handled == ["good"], "the good message", DEADLINE_S)
        letters = await _dead_letters(js, key_subject=subject)
        # A service never gives up reconnecting (a closed connection makes pull loops spin).
        assert broker.config.connection_state.connection.options["max_reconnect_attempts"] == -1
    assert len(letters) == 1
    assert "invalid payload" in letters[0].reason
    assert letters[0].consumer == durable and letters[0].deliveries == 1
    assert '"not"' in letters[0].data_preview
    info = await js.consumer_info(subjects.WORK_STREAM, durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_failing_handler_gives_up_after_max_deliver(settings, nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    key = new_id()
    subject = subjects.work("bustest", key)
    durable = f"bustest-{key}"
    await ensure_consumer(
        js, subjects.WORK_STREAM, pull_consumer_config(durable, subject, max_deliver=3)
    )
    attempts: list[int] = []
    broker = make_broker(settings, max_deliver=3)

    @broker.subscriber(
        subject,
        stream=JStream(subjects.WORK_STREAM, declare=False),
        durable=durable,
        pull_sub=PullSub(batch_size=1, timeout=0.3),
    )
    async def handle(event: EventEnvelope) -> None:
        attempts.append(1)
        raise RuntimeError("model endpoint down")

    await js.publish(subject, failed(key, 1).to_bytes())
    async with broker:
        await broker.start()
        letters = await wait_until(
            lambda: _dead_letters(js, key_subject=subject), "a dead letter", DEADLINE_S
        )
    assert len(attempts) == 3
    assert letters[0].reason == "gave up after 3 attempts: RuntimeError: model endpoint down"


async def _dead_letters(js, *, key_subject: str) -> list[DeadLettered]:
    found = await collect(js, subjects.aggregate_events("deadletter"))
    bodies = [e.body() for e in found]
    return [b for b in bodies if isinstance(b, DeadLettered) and b.subject == key_subject]


async def test_in_progress_acks_keep_long_work_from_redelivery(settings, nats_client) -> None:
    from rollout.shared.bus.keepalive import working_on

    js = nats_client.jetstream()
    await ensure_streams(js)
    key = new_id()
    subject = subjects.work("bustest", key)
    durable = f"bustest-{key}"
    await ensure_consumer(
        js, subjects.WORK_STREAM, pull_consumer_config(durable, subject, ack_wait_s=1.0)
    )
    await js.publish(subject, failed(key, 1).to_bytes())
    sub = await js.pull_subscribe_bind(durable=durable, stream=subjects.WORK_STREAM)
    (msg,) = await sub.fetch(1, timeout=DEADLINE_S)
    async with working_on(msg, every_s=0.3):
        # Stands in for work three times longer than AckWait (a model call, a training step).
        await asyncio.sleep(3.0)
        info = await js.consumer_info(subjects.WORK_STREAM, durable)
        assert info.num_redelivered == 0 and info.num_ack_pending == 1
    await msg.ack_sync()
    info = await js.consumer_info(subjects.WORK_STREAM, durable)
    assert info.num_redelivered == 0 and info.num_ack_pending == 0 and info.num_pending == 0


def _versioned(event: EventEnvelope, version: str, **extra_payload: object) -> bytes:
    """`event` as a producer of schema `version` would write it (extra fields included)."""
    data = event.model_dump(mode="json")
    data["schema_version"] = version
    data["payload"] = {**data["payload"], **extra_payload}
    return json.dumps(data).encode()


async def test_a_major_version_event_is_dead_lettered_with_the_reason_and_next_is_handled(
    settings, nats_client
) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    key = new_id()
    subject = subjects.work("bustest", key)
    durable = f"bustest-{key}"
    await ensure_consumer(js, subjects.WORK_STREAM, pull_consumer_config(durable, subject))
    handled: list[str] = []
    broker = make_broker(settings)

    @broker.subscriber(
        subject,
        stream=JStream(subjects.WORK_STREAM, declare=False),
        durable=durable,
        pull_sub=PullSub(batch_size=4, timeout=0.5),
    )
    async def handle(event: EventEnvelope) -> None:
        handled.append(event.body().reason)

    await js.publish(subject, _versioned(failed(key, 1, reason="from v2"), "2.0"))
    # A newer minor with a field this reader does not know: read, the field ignored.
    await js.publish(subject, _versioned(failed(key, 2, reason="minor"), "1.7", severity="high"))
    async with broker:
        await broker.start()
        await wait_until(lambda: handled == ["minor"], "the newer-minor message", DEADLINE_S)
        letters = await _dead_letters(js, key_subject=subject)
    assert len(letters) == 1
    assert letters[0].reason.startswith("unsupported schema version 2.0 of run.failed event")
    assert "major version 1" in letters[0].reason


async def test_the_events_stream_refuses_purge_and_delete_even_for_a_service(nats_client) -> None:
    js = nats_client.jetstream()
    # A stream made before the rule (no denies) is brought to it by the next service start.
    await js.add_stream(
        config=api.StreamConfig(name=subjects.EVENTS_STREAM, subjects=[subjects.ALL_EVENTS])
    )
    await ensure_streams(js)
    info = await js.stream_info(subjects.EVENTS_STREAM)
    assert info.config.deny_delete and info.config.deny_purge
    run_id = new_id()
    first = await EventPublisher(js).publish(failed(run_id, 0))
    with pytest.raises(APIError, match="purge"):
        await js.purge_stream(subjects.EVENTS_STREAM)
    with pytest.raises(APIError, match="purge"):
        await js.purge_stream(subjects.EVENTS_STREAM, subject=subjects.run_events(run_id))
    with pytest.raises(APIError, match="delete"):
        await js.delete_msg(subjects.EVENTS_STREAM, first.seq)
    assert [e.id for e in await collect(js, subjects.run_events(run_id))] == [failed(run_id, 0).id]
    await ensure_streams(js)  # idempotent with the denies set


async def test_a_read_holds_no_consumer_and_is_bounded_merged_and_batched(nats_client) -> None:
    """Reads are direct gets: nothing is left on the stream, however many there are.

    A read ends at the stream's end when it was called; a list of filters comes merged in
    stream order; a read longer than a batch (in messages or bytes) continues where it stopped.
    """
    js = nats_client.jetstream()
    await ensure_streams(js)
    run_id, other = new_id()[:16], new_id()[:16]
    publisher = EventPublisher(js)
    for i in range(5):
        await publisher.publish(failed(run_id, i, reason=f"r{i}"))
        await publisher.publish(failed(other, i))
    read = [
        EventEnvelope.from_bytes(m.data) async for m in read_events(js, subjects.run_events(run_id))
    ]
    assert [e.body().reason for e in read] == [f"r{i}" for i in range(5)]
    # Batches of 2 messages: the read asks again from where each one stopped.
    small = [m async for m in read_events(js, subjects.run_events(run_id), batch=2)]
    assert [m.seq for m in small] == sorted(m.seq for m in small) and len(small) == 5
    both = [
        m async for m in read_events(js, [subjects.run_events(other), subjects.run_events(run_id)])
    ]
    assert [m.seq for m in both] == sorted(m.seq for m in both) and len(both) == 10
    assert {m.subject.split(".")[3] for m in both} == {run_id, other}
    # Bounded at its call: an event appended while it reads is not part of it.
    reader = read_events(js, subjects.run_events(run_id))
    first = await anext(reader)
    await publisher.publish(failed(run_id, 9, reason="later"))
    rest = [m async for m in reader]
    assert first.metadata.num_pending == 4 and len(rest) == 4
    assert all(EventEnvelope.from_bytes(m.data).body().reason != "later" for m in rest)
    # A filter nothing matches ends at once.
    assert [m async for m in read_events(js, subjects.run_events("none"))] == []
    for _ in range(20):
        assert [m async for m in read_events(js, subjects.run_events("none"))] == []
    info = await js.stream_info(subjects.EVENTS_STREAM)
    assert info.state.consumer_count == 0


async def test_a_followed_read_sees_new_events_without_a_consumer(nats_client) -> None:
    js = nats_client.jetstream()
    await ensure_streams(js)
    run_id = new_id()[:16]
    publisher = EventPublisher(js)
    await publisher.publish(failed(run_id, 0, reason="before"))
    following = read_events(js, subjects.run_events(run_id), follow=True)
    assert EventEnvelope.from_bytes((await anext(following)).data).body().reason == "before"
    waiting = asyncio.ensure_future(anext(following))
    await asyncio.sleep(0.3)  # the follower is idle at its longest pause
    assert not waiting.done()
    await publisher.publish(failed(run_id, 1, reason="after"))
    late = await asyncio.wait_for(waiting, 5)
    assert EventEnvelope.from_bytes(late.data).body().reason == "after"
    assert (await js.stream_info(subjects.EVENTS_STREAM)).state.consumer_count == 0
    await following.aclose()


async def test_a_followed_read_ends_when_cancelled_even_as_a_reply_lands(
    nats_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python 3.11's wait_for returns a reply that lands with a cancel and drops the cancel: a
    # follow that went on asking then never ended (the viewer's shutdown waited on it).
    from rollout.shared.bus import reader

    monkeypatch.setattr(reader, "FOLLOW_PAUSE_MIN_S", 0.0)  # always asking: the race is
    monkeypatch.setattr(reader, "FOLLOW_PAUSE_MAX_S", 0.0)  # met within a few cancels
    js = nats_client.jetstream()
    await ensure_streams(js)
    run_id = new_id()[:16]
    await EventPublisher(js).publish(failed(run_id, 0))

    async def follow() -> None:
        async for _ in read_events(js, subjects.run_events(run_id), follow=True):
            pass

    rng = random.Random(7)
    for attempt in range(40):
        task = asyncio.create_task(follow())
        await asyncio.sleep(rng.uniform(0.0, 0.01))  # a cancel at any moment of its asking
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=DEADLINE_S)
        if not done:
            task.cancel()  # once more: the failure below leaves nothing running
        assert done, f"cancel {attempt} did not end the followed read"
        assert task.cancelled()


async def test_a_one_off_read_of_nothing_ends_without_waiting(nats_client) -> None:
    """A job or run with no events yet: its history read said so only after a 1 s fetch."""
    js = nats_client.jetstream()
    await ensure_streams(js)
    await EventPublisher(js).publish(failed(new_id()[:16], 0))  # the stream is not empty
    nothing = read_events(js, subjects.run_events("no-such-run"))
    assert await asyncio.wait_for(anext(nothing, None), 1) is None


@pytest.mark.parametrize("unlimited", [True, False])
async def test_a_transient_failure_is_retried_past_max_deliver_where_deliveries_are_unlimited(
    settings, nats_client, unlimited: bool
) -> None:
    # The bus away for a while (here 4 attempts): a consumer that redelivers without limit
    # keeps the message until it gets through; one with a limit dead-letters it as before.
    js = nats_client.jetstream()
    await ensure_streams(js)
    key = new_id()
    subject = subjects.work("bustest", key)
    durable = f"bustest-{key}"
    config = pull_consumer_config(durable, subject, max_deliver=-1 if unlimited else 2)
    await ensure_consumer(js, subjects.WORK_STREAM, config)
    attempts: list[int] = []
    broker = make_broker(settings, max_deliver=2)

    @broker.subscriber(
        subject,
        stream=JStream(subjects.WORK_STREAM, declare=False),
        durable=durable,
        pull_sub=PullSub(batch_size=1, timeout=0.3),
    )
    async def handle(event: EventEnvelope) -> None:
        attempts.append(1)
        if len(attempts) <= 4:
            raise nats.errors.NoRespondersError

    await js.publish(subject, failed(key, 1).to_bytes())
    async with broker:
        await broker.start()
        if unlimited:
            await wait_until(lambda: len(attempts) == 5, "the fifth attempt", DEADLINE_S)
        else:
            await wait_until(
                lambda: _dead_letters(js, key_subject=subject), "a dead letter", DEADLINE_S
            )
    if unlimited:
        assert await _dead_letters(js, key_subject=subject) == []
    else:
        assert len(attempts) == 2
