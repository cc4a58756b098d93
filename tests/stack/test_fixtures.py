"""The shared fixtures give real, authenticated servers and isolated databases."""

from __future__ import annotations

import asyncio

import asyncpg
import nats.aio.client
import nats.errors
from waiting import wait_until

from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.nats import NatsServer


async def test_nats_client_has_jetstream(nats_client: nats.aio.client.Client) -> None:
    js = nats_client.jetstream()
    await js.add_stream(name="FIXTURE", subjects=["fixture.>"])
    ack = await js.publish("fixture.a", b"x")
    assert ack.seq == 1


async def test_jetstream_is_empty_for_each_test(nats_client: nats.aio.client.Client) -> None:
    assert await nats_client.jetstream().streams_info() == []


async def test_pg_dsn_is_a_fresh_database(pg_dsn: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        tables = await conn.fetchval(
            "select count(*) from information_schema.tables where table_schema = 'public'"
        )
        assert tables == 0
        await conn.execute("create table t (x int)")
    finally:
        await conn.close()


async def test_settings_reach_both_servers(settings: Settings) -> None:
    assert settings.database_url is not None
    client = await connect_nats(settings)
    await client.close()
    conn = await asyncpg.connect(settings.database_url)
    assert await conn.fetchval("select 1") == 1
    await conn.close()


async def test_fresh_nats_keeps_data_across_restart(fresh_nats: NatsServer) -> None:
    creds = {"user": fresh_nats.user, "password": fresh_nats.password}
    client = await nats.connect(fresh_nats.url, **creds)
    js = client.jetstream()
    await js.add_stream(name="KEEP", subjects=["keep.>"])
    await js.publish("keep.a", b"kept")
    await client.close()
    fresh_nats.stop()
    fresh_nats.start()
    client = await nats.connect(fresh_nats.url, **creds)
    msg = await client.jetstream().get_msg("KEEP", 1)
    assert msg.data == b"kept"
    await client.close()


async def test_connect_nats_rides_out_a_server_restart(fresh_nats: NatsServer, tmp_path) -> None:  # noqa: ANN001
    settings = Settings(
        home=tmp_path,
        nats_url=fresh_nats.url,
        database_url=None,
        nats_user=fresh_nats.user,
        nats_password=fresh_nats.password,
        external_nats=True,
    )
    client = await connect_nats(settings, reconnect_time_wait=0.1)
    try:
        fresh_nats.stop()
        fresh_nats.start()
        # The same client object works again once it has reconnected on its own.

        async def account() -> object:
            try:
                return await asyncio.wait_for(client.jetstream().account_info(), 1)
            except (nats.errors.Error, TimeoutError):
                return None

        info = await wait_until(account, "the client to reconnect", 20)
        assert info.streams == 0
    finally:
        await client.close()
