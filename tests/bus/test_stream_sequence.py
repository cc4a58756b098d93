"""`stream_sequence` reads the same number as nats-py's metadata, from the ack subject alone."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from rollout.shared.bus.sequence import stream_sequence
from rollout.shared.settings import connect_nats


async def test_matches_the_metadata_of_real_jetstream_messages(settings) -> None:
    nc = await connect_nats(settings)
    js = nc.jetstream()
    try:
        await js.add_stream(name="SEQPROBE", subjects=["seqprobe.>"])
        for i in range(5):
            await js.publish(f"seqprobe.n.{i}", b"x")
        await js.publish("seqprobe.skip", b"x")  # a gap in what the filtered consumer sees
        for i in range(5, 8):
            await js.publish(f"seqprobe.n.{i}", b"x")
        sub = await js.pull_subscribe("seqprobe.n.*", durable="seqprobe")
        got = []
        while len(got) < 8:
            got.extend(await sub.fetch(8 - len(got), timeout=5))
        assert [stream_sequence(m) for m in got] == [m.metadata.sequence.stream for m in got]
        assert [stream_sequence(m) for m in got] == [1, 2, 3, 4, 5, 7, 8, 9]
    finally:
        await js.delete_stream("SEQPROBE")
        await nc.close()


def test_reads_the_v2_ack_subject_and_refuses_a_plain_message() -> None:
    # $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<stream seq>.<consumer
    # seq>.<timestamp>.<pending>.<token>
    v2 = Msg(None, reply="$JS.ACK._.ahash.EVENTS.tracker.2.4711.42.1700000000000000000.3.xyz")  # type: ignore[arg-type]
    assert stream_sequence(v2) == v2.metadata.sequence.stream == 4711
    with pytest.raises(NotJSMessageError):
        stream_sequence(Msg(None, reply="_INBOX.abc"))  # type: ignore[arg-type]
