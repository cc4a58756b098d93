"""The leader lease on a real nats-server: one holder, expiry hands it over, a deposed one stops."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import nats.aio.client
import pytest
from waiting import wait_until

from rollout.shared.bus.lease import (
    BUCKET,
    Lease,
    bucket_ttl,
    current_holder,
    lead,
    lease_bucket,
)
from rollout.shared.settings import Settings, connect_nats

TTL_S = 1.0


async def _wait(predicate, what: str, limit_s: float) -> float:  # type: ignore[no-untyped-def]
    """Seconds until `predicate()` (async) is true; AssertionError past `limit_s`."""
    start = time.monotonic()
    await wait_until(predicate, what, limit_s, interval_s=0.02)
    return time.monotonic() - start


@pytest.fixture
async def leases(nats_client: nats.aio.client.Client):  # type: ignore[no-untyped-def]
    """Two replicas' views of lease `svc` in a bucket with a 1 s TTL."""
    kv = await lease_bucket(nats_client.jetstream(), TTL_S)
    ttl = await bucket_ttl(kv)
    return kv, Lease(kv, "svc", "a", ttl), Lease(kv, "svc", "b", ttl)


async def test_of_two_replicas_racing_for_the_lease_exactly_one_holds_it(leases) -> None:  # type: ignore[no-untyped-def]
    kv, a, b = leases
    assert a.ttl_s == pytest.approx(TTL_S)
    won = await asyncio.gather(a.try_acquire(), b.try_acquire())
    assert sorted(won) == [False, True]
    holder = a if a.held else b
    assert await current_holder(kv, "svc") == holder.holder
    # The holder renews and keeps it; the other keeps being refused.
    assert await holder.renew()
    other = b if holder is a else a
    assert not await other.try_acquire()
    assert not other.held


async def test_an_expired_lease_goes_to_the_standby_and_the_old_holder_cannot_renew(
    leases,  # type: ignore[no-untyped-def]
) -> None:
    kv, a, b = leases
    assert await a.try_acquire()
    # `a` stops renewing (a SIGKILLed or frozen holder): it counts itself deposed after one
    # TTL, and the server forgets the key about then, so the standby gets in.
    took = await _wait(b.try_acquire, "the standby to take the lease", limit_s=TTL_S * 4)
    assert not a.held
    assert TTL_S * 0.5 < took < TTL_S * 3
    assert await current_holder(kv, "svc") == "b"
    # The deposed holder's renewal names a revision that is gone: refused, and it knows.
    assert not await a.renew()
    assert a.revision is None and not a.held
    assert await current_holder(kv, "svc") == "b"


async def test_a_renewal_whose_reply_was_lost_is_recognised_as_our_own(leases) -> None:  # type: ignore[no-untyped-def]
    kv, a, b = leases
    assert await a.try_acquire()
    # A renewal landed but its reply never came back: the key moved on, still naming `a`.
    assert a.revision is not None
    await kv.update("svc", b"a", last=a.revision)
    assert await a.renew()
    assert a.held and await a.renew()
    assert not await b.try_acquire()


async def test_a_released_lease_is_taken_at_once(leases) -> None:  # type: ignore[no-untyped-def]
    _, a, b = leases
    assert await a.try_acquire()
    await a.release()
    assert not a.held
    assert await b.try_acquire()


async def test_lead_runs_the_duty_only_while_the_lease_is_held(leases) -> None:  # type: ignore[no-untyped-def]
    kv, a, b = leases
    running = asyncio.Event()
    stopped = asyncio.Event()

    async def duty() -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    leader = asyncio.create_task(lead(a, duty))
    try:
        await asyncio.wait_for(running.wait(), 5)
        # Held across several TTLs: the holder renews it (each renewal is a new revision).
        first = a.revision or 0
        await _wait(
            lambda: _true(a.revision is not None and a.revision >= first + 6),
            "six renewals (two TTLs)",
            limit_s=TTL_S * 4,
        )
        assert not stopped.is_set() and a.held
        assert not await b.try_acquire()
        # Someone else takes the key from under it (as after an expiry the holder missed).
        await kv.delete("svc")
        assert await b.try_acquire()
        stopped_after = await _wait(
            lambda: _is_set(stopped), "the deposed leader to stop its duty", limit_s=TTL_S * 2
        )
        assert stopped_after <= TTL_S
        assert await current_holder(kv, "svc") == "b"
    finally:
        leader.cancel()
        await asyncio.gather(leader, return_exceptions=True)
    # A deposed holder's release does not touch the new holder's key.
    assert await current_holder(kv, "svc") == "b"


async def test_a_clean_stop_of_the_leader_hands_over_without_waiting_for_the_ttl(
    leases,  # type: ignore[no-untyped-def]
) -> None:
    kv, a, b = leases
    running = asyncio.Event()

    async def duty() -> None:
        running.set()
        await asyncio.Event().wait()

    leader = asyncio.create_task(lead(a, duty))
    await asyncio.wait_for(running.wait(), 5)
    leader.cancel()
    await asyncio.gather(leader, return_exceptions=True)
    assert await current_holder(kv, "svc") is None
    assert await b.try_acquire()


async def test_a_failing_duty_gives_the_lease_up_and_raises(leases) -> None:  # type: ignore[no-untyped-def]
    kv, a, _ = leases

    async def duty() -> None:
        raise RuntimeError("cannot start the leader's consumers")

    with pytest.raises(RuntimeError, match="leader's consumers"):
        await asyncio.wait_for(lead(a, duty), 5)
    assert await current_holder(kv, "svc") is None


async def _is_set(event: asyncio.Event) -> bool:
    return event.is_set()


async def _true(value: bool) -> bool:
    return value


class _SwallowingLease(Lease):
    """A standby whose request swallows a cancel, as Python 3.11's wait_for does when the
    reply lands in the same loop iteration as the cancel."""

    swallowed = False

    async def try_acquire(self) -> bool:
        if self.swallowed:
            return False
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.swallowed = True
        return False


async def test_a_standby_stops_even_when_a_request_swallowed_the_cancel(leases) -> None:  # type: ignore[no-untyped-def]
    kv, _, _ = leases
    standby = _SwallowingLease(kv, "svc", "s", TTL_S)

    async def duty() -> None:
        raise AssertionError("a standby never leads here")

    task = asyncio.create_task(lead(standby, duty))
    await asyncio.sleep(0)  # let it reach its request
    task.cancel()
    try:
        await asyncio.wait({task}, timeout=5)
        assert task.done() and standby.swallowed, "the standby went on after its cancel"
        assert task.cancelled()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _FreezableLink:
    """A TCP relay to the nats-server that can stop forwarding (a stalled network path): the
    connection stays up, but no request through it gets an answer."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self.tasks.add(task)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                await self.flowing.wait()
                dst.write(data)
                await dst.drain()
        dst.close()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            self.server.close()


@pytest.fixture
async def link(nats_settings: Settings) -> AsyncIterator[tuple[_FreezableLink, Settings]]:
    """A freezable relay to the test nats-server, and settings that connect through it."""
    url = urlsplit(nats_settings.nats_url)
    relay = _FreezableLink(url.hostname or "127.0.0.1", url.port or 4222)
    port = await relay.start()
    relayed = url._replace(netloc=url.netloc.replace(f":{url.port}", f":{port}")).geturl()
    yield relay, dataclasses.replace(nats_settings, nats_url=relayed, nats_urls=())
    await relay.close()


async def test_a_leader_whose_renewals_stall_stops_before_a_standby_can_take_over(
    leases,  # type: ignore[no-untyped-def]
    link,  # type: ignore[no-untyped-def]
) -> None:
    kv, _, b = leases
    relay, relayed = link
    nc = await connect_nats(relayed)
    stopped_at: list[float] = []
    running = asyncio.Event()

    async def duty() -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped_at.append(time.monotonic())

    a = Lease(await nc.jetstream().key_value(BUCKET), "svc", "a", TTL_S)
    leader = asyncio.create_task(lead(a, duty))
    try:
        await asyncio.wait_for(running.wait(), 5)
        first = a.revision or 0
        await _wait(lambda: _true((a.revision or 0) > first), "a renewal", limit_s=TTL_S * 2)
        # The path to the server stalls: each renewal times out, its outcome unknown.
        relay.flowing.clear()
        await _wait(b.try_acquire, "the standby to take the lease", limit_s=TTL_S * 4)
        acquired_at = time.monotonic()
        assert stopped_at, "the stalled leader was still running its duty"
        assert stopped_at[0] < acquired_at
        assert await current_holder(kv, "svc") == "b"
    finally:
        leader.cancel()
        relay.flowing.set()
        await asyncio.gather(leader, return_exceptions=True)
        await nc.close()


class _AcquiringThroughACancel(Lease):
    """A replica whose create lands in the same moment as its cancel (the cancel swallowed,
    the key written): what Python 3.11's wait_for does when both come together."""

    async def try_acquire(self) -> bool:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        return await super().try_acquire()


async def test_a_lease_won_as_the_cancel_came_is_given_back(leases) -> None:  # type: ignore[no-untyped-def]
    kv, _, b = leases
    racer = _AcquiringThroughACancel(kv, "svc", "r", TTL_S)

    async def duty() -> None:
        raise AssertionError("a cancelled replica never leads")

    task = asyncio.create_task(lead(racer, duty))
    await asyncio.sleep(0)  # let it reach its request
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.done() and task.cancelled()
    assert racer.terms == 1, "the create did not land"
    # No key left behind: the standby gets in at once, not a TTL later.
    assert await current_holder(kv, "svc") is None
    assert await b.try_acquire()
