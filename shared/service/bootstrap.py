"""The bootstrap every service shares: connect, streams, consumers, database, brokers, stop.

A service says what it consumes, whether it needs Postgres and how to build its brokers;
`serve_service` does the rest in one order for all of them:

    connect -> ensure the streams -> ensure the declared consumers -> pool + migrations
      -> start the brokers -> run (by default: until cancelled) -> stop brokers, close pool

Heartbeats come from the process entry point (`rollout serve`, rollout.shared.stack.serve),
which beats around every service's `serve` through `beating` below, kit-built or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import asyncpg
import nats.aio.client
import nats.errors
from faststream.nats import NatsBroker
from nats.js import JetStreamContext

from rollout.shared.bus.deadletter import describe
from rollout.shared.bus.streams import ensure_consumer, ensure_streams, retry_api
from rollout.shared.errors import RolloutError
from rollout.shared.objectstore import ObjectStore
from rollout.shared.observability import get_logger
from rollout.shared.service import durables
from rollout.shared.service.consumer import Consumer
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.health import (
    BEATS_DIR,
    DEFAULT_INTERVAL,
    READINESS,
    Readiness,
    default_replica_id,
    heartbeat,
)
from rollout.shared.stack.lag_probe import beat_lag
from rollout.shared.store.db import close_pool, create_pool, migrate
from rollout.shared.store.trajectories import object_store

log = get_logger(__name__)


@dataclass
class ServiceRuntime:
    """What a service's setup works with: its settings, database pool and started brokers."""

    name: str
    settings: Settings
    pool: asyncpg.Pool | None = None
    # The setup connection, open for the service's life only when it asked to keep it.
    nc: nats.aio.client.Client | None = None
    brokers: list[NatsBroker] = field(default_factory=list)
    _stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    _store: ObjectStore | None = None

    @property
    def js(self) -> JetStreamContext:
        """JetStream on the kept setup connection."""
        assert self.nc is not None, f"{self.name}: serve_service(keep_connection=True) first"
        return self.nc.jetstream()

    def database(self) -> asyncpg.Pool:
        """The migrated pool (the service was declared with `database=True`)."""
        assert self.pool is not None, f"{self.name}: serve_service(database=True) first"
        return self.pool

    async def start(self, broker: NatsBroker) -> NatsBroker:
        """Start `broker`; it is stopped when the service stops (last started, first stopped)."""
        await self._stack.enter_async_context(started(broker))
        self.brokers.append(broker)
        return broker

    def object_store(self) -> ObjectStore:
        """The platform's object store, opened once for the service and closed when it stops."""
        if self._store is None:
            self._store = object_store(self.settings)
            self.on_stop(self._store.close)
        return self._store

    def on_stop(self, close: Callable[[], Awaitable[object]]) -> None:
        """Run `close` when the service stops (before what was set up earlier is closed)."""
        self._stack.push_async_callback(close)


@contextlib.asynccontextmanager
async def started(broker: NatsBroker) -> AsyncIterator[NatsBroker]:
    """A started broker for the block; stopped on the way out, however the block ends."""
    await retry_api(lambda: _start_once(broker), "broker start")
    try:
        yield broker
    finally:
        await stop_broker(broker)


async def _start_once(broker: NatsBroker) -> None:
    """Start `broker`; one that fails midway (a JetStream API call timed out on a loaded
    server, some subscribers bound) is stopped again, so that a retry starts it whole."""
    try:
        await broker.start()
    except BaseException:
        await stop_broker(broker)
        raise


async def stop_broker(broker: NatsBroker) -> None:
    """Stop `broker`'s subscribers and drain its connection; a connection that cannot drain
    (NATS away: reconnecting, or closed) is closed instead, never raised from: a tracker
    stepping down because NATS restarted stops its leader broker so, and stays a replica."""
    try:
        await broker.stop()
    except (nats.errors.ConnectionReconnectingError, nats.errors.ConnectionClosedError) as exc:
        log.warning("broker stopped without draining its connection", error=describe(exc))
        connection, broker._connection = broker._connection, None
        if connection is not None:
            with contextlib.suppress(OSError, nats.errors.Error):
                await connection.close()  # its transport may be gone already
        broker.config.disconnect()


async def ensure_consumers(js: JetStreamContext, consumers: Sequence[Consumer]) -> None:
    """Create or update each declared durable with its declared config (idempotent)."""
    for consumer in consumers:
        await ensure_consumer(js, consumer.stream, consumer.config())


@contextlib.asynccontextmanager
async def running(
    name: str,
    settings: Settings,
    *,
    consumers: Sequence[Consumer] = (),
    database: bool = False,
    keep_connection: bool = False,
) -> AsyncIterator[ServiceRuntime]:
    """Streams and consumers ensured, Postgres migrated; everything closed after the block."""
    if database and not settings.database_url:
        raise RolloutError(f"the {name} needs a database (ROLLOUT_DATABASE_URL or `rollout up`)")
    runtime = ServiceRuntime(name, settings)
    async with contextlib.AsyncExitStack() as stack:
        nc = await connect_nats(settings, name=name)
        stack.push_async_callback(nc.close)  # a second close is a no-op
        js = nc.jetstream()
        await ensure_streams(js, settings.stream_replicas)
        # Before any broker starts: FastStream binds to the durable as it finds it.
        await ensure_consumers(js, consumers)
        if keep_connection:
            runtime.nc = nc
        else:
            await nc.close()  # the brokers have their own connections
        if database:
            assert settings.database_url is not None
            pool = await create_pool(settings.database_url)
            stack.push_async_callback(close_pool, pool)
            await migrate(pool)
            runtime.pool = pool
        # Brokers and the service's own resources close before the pool and the connection.
        stack.push_async_callback(runtime._stack.aclose)
        yield runtime


async def until_cancelled(runtime: ServiceRuntime) -> None:
    """The default life of a service: its brokers work until the task is cancelled."""
    await asyncio.Event().wait()


BuildFn = Callable[[ServiceRuntime], Awaitable[NatsBroker | Sequence[NatsBroker] | None]]


async def serve_service(
    name: str,
    settings: Settings,
    build: BuildFn,
    *,
    consumers: Sequence[Consumer] = (),
    database: bool = False,
    keep_connection: bool = False,
    run: Callable[[ServiceRuntime], Awaitable[None]] = until_cancelled,
) -> None:
    """Run one replica of service `name` until cancelled (or until `run` returns).

    `build` gets the ready runtime and returns the broker(s) to start (or starts what it
    needs itself with `runtime.start`); `run` is the service's life once they are started.
    Under `rollout serve`, its beats say "not ready" until the brokers have started.
    """
    readiness = READINESS.get()
    if readiness is not None:
        # Before the first await: the beat task has not sent a beat yet (it runs only once
        # this task suspends), so no beat says "ready" before the brokers are up.
        readiness.starting()
    async with running(
        name, settings, consumers=consumers, database=database, keep_connection=keep_connection
    ) as runtime:
        built = await build(runtime)
        brokers = [] if built is None else [built] if isinstance(built, NatsBroker) else built
        for broker in brokers:
            await runtime.start(broker)
        log.info("service started", service=name, consumers=[c.name for c in consumers])
        if readiness is not None:
            readiness.started()
        with frozen_startup_heap():
            await run(runtime)


@contextlib.contextmanager
def frozen_startup_heap() -> Iterator[None]:
    """Keep what start-up built out of the collector's full collections while the block runs.

    Modules, pydantic schemas and the brokers live as long as the process; re-scanning them on
    every full collection cost 10-25% of the actor's and verifier's CPU per rollout
    (benchmarks/pipeline.py, batch 64). Collected first, so no garbage is frozen with them;
    unfrozen after, because services sharing a process (tests, one-process stacks) stop and
    start again.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.asynccontextmanager
async def beating(
    name: str,
    settings: Settings,
    *,
    replica_id: str | None = None,
    interval: float = DEFAULT_INTERVAL,
) -> AsyncIterator[str]:
    """The replica's heartbeat (on a connection of its own) while the block runs; its id."""
    replica_id = replica_id or default_replica_id()
    nc = await connect_nats(settings, name=f"{name}-heartbeat")
    js = nc.jetstream()
    readiness = Readiness()
    # A service that keeps read models says in each beat how far behind they are: what
    # `rollout health` fails on when they stall (a replica serving stale reads is not ready).
    projection = durables.PROJECTIONS.get(name)
    lag = (lambda: beat_lag(js, projection)) if projection is not None else None
    token = READINESS.set(readiness)  # what serve_service marks, when the block runs one
    beats = asyncio.create_task(
        heartbeat(
            js,
            name,
            replica_id,
            interval,
            settings.stream_replicas,
            beat_dir=settings.home / BEATS_DIR,
            readiness=readiness,
            projection=lag,
        )
    )
    try:
        yield replica_id
    finally:
        READINESS.reset(token)
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
        await nc.close()
