"""The embedded servers only let in clients with the generated credentials."""

from __future__ import annotations

import dataclasses

import asyncpg
import nats
import nats.errors
import pytest

from rollout.errors import RolloutError
from rollout.shared.settings import Settings, connect_nats
from rollout.shared.stack.nats import NatsServer
from rollout.shared.stack.postgres import PostgresServer


async def _connect_raw(url: str, **creds: str) -> None:
    client = await nats.connect(
        url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0, **creds
    )
    await client.close()


async def test_nats_rejects_a_client_without_credentials(nats_server: NatsServer) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await _connect_raw(nats_server.url)


async def test_nats_rejects_wrong_credentials(nats_server: NatsServer) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await _connect_raw(nats_server.url, user=nats_server.user, password="wrong")


async def test_nats_admits_the_generated_credentials(nats_server: NatsServer) -> None:
    client = await nats.connect(
        nats_server.url,
        user=nats_server.user,
        password=nats_server.password,
        allow_reconnect=False,
        connect_timeout=2,
        max_reconnect_attempts=0,
    )
    try:
        # Admitted, and allowed to act: the server answers a JetStream request of this user.
        info = await client.jetstream().account_info()
        assert client.is_connected
        assert info.limits is not None
    finally:
        await client.close()


async def test_connect_nats_reports_wrong_credentials_clearly(nats_settings: Settings) -> None:
    wrong = dataclasses.replace(nats_settings, nats_password="wrong")
    with pytest.raises(RolloutError, match="refused the connection") as caught:
        await connect_nats(wrong)
    assert "wrong" not in str(caught.value).replace("wrong_", "")


async def test_connect_nats_reports_an_absent_server(nats_settings: Settings) -> None:
    absent = dataclasses.replace(nats_settings, nats_url="nats://127.0.0.1:1")
    with pytest.raises(RolloutError, match="cannot reach NATS"):
        await connect_nats(absent)


def test_secret_files_are_private(nats_server: NatsServer) -> None:
    assert (nats_server.home / "credentials.json").stat().st_mode & 0o777 == 0o600
    assert nats_server.config_path.stat().st_mode & 0o777 == 0o600


def test_nats_listens_on_loopback_only(nats_server: NatsServer) -> None:
    config = nats_server.config_path.read_text()
    assert f"listen: 127.0.0.1:{nats_server.port}" in config
    assert f"http: 127.0.0.1:{nats_server.monitor_port}" in config
    assert nats_server.healthy()


async def test_postgres_rejects_a_wrong_password(pg_server: PostgresServer) -> None:
    wrong = pg_server.dsn().replace(pg_server.password, "wrong")
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(wrong)
    conn = await asyncpg.connect(pg_server.dsn())
    assert await conn.fetchval("select current_database()") == "rollout"
    await conn.close()
