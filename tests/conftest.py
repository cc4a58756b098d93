"""Shared fixtures: a real nats-server (auth on) and a real Postgres, started by our launchers."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncpg
import nats.aio.client
import pytest

from rollout.shared.settings import CREDENTIALS_FILE, Settings, connect_nats
from rollout.shared.stack.files import write_json
from rollout.shared.stack.nats import NatsCluster, NatsServer, start_nats, start_nats_cluster
from rollout.shared.stack.postgres import PostgresServer, start_postgres

# The longest files (measured: 60-170 s each on 2 cores) are handed out first. Under
# `--dist loadfile` a worker takes a whole file at a time, so one of these started last
# keeps the run going while the other worker idles; started first, the short files fill in
# around them. Only the order of files changes, never the order within one.
HEAVY_FILES = (
    "tests/stack/test_readme_commands.py",
    "tests/pipeline/test_cli_platform.py",
    "tests/stack/test_stack_up.py",
    "tests/pipeline/test_outcomes.py",
    "tests/envs/test_reward_hacking.py",
    "tests/pipeline/test_snapshots.py",
    "tests/auth/test_auth_cli.py",
    "tests/audit/test_audit_cli.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the heaviest test files to the front (a stable sort: the rest keep their order)."""
    rank = {path: i for i, path in enumerate(HEAVY_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def servers_root() -> Iterator[Path]:
    """A private temp dir for server homes, removed at the end of the session.

    Not pytest's tmp_path: as root, Postgres runs as another user that must traverse to its
    data dir, and every pytest session that starts (in parallel too) resets pytest's temp
    root to 0700, which would pull the ground from under a running server.
    """
    root = Path(tempfile.mkdtemp(prefix="rollout-tests-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def stack_home(servers_root: Path) -> Path:
    """A fresh ROLLOUT_HOME for one test (safe for an embedded Postgres)."""
    return Path(tempfile.mkdtemp(prefix="home-", dir=servers_root))


@pytest.fixture(scope="session")
def nats_server(servers_root: Path) -> Iterator[NatsServer]:
    """One nats-server for the session: free port, JetStream, generated credentials."""
    server = start_nats(servers_root / "nats", port=0, monitor_port=0, attached=True)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pg_server(servers_root: Path) -> Iterator[PostgresServer]:
    """One Postgres for the session: free port, fsync off; tests get their own databases."""
    server = start_postgres(servers_root / "pg", port=0, attached=True, fast=True)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: NatsServer) -> str:
    """URL of the session nats-server (credentials not included)."""
    return nats_server.url


@pytest.fixture(scope="session")
def nats_creds(nats_server: NatsServer) -> dict[str, str]:
    """`user` and `password` for the session nats-server, as nats.connect keyword arguments."""
    return {"user": nats_server.user, "password": nats_server.password}


def settings_for(
    home: Path, server: NatsServer, database_url: str | None, *, external: bool = True
) -> Settings:
    """Settings pointing at `server` (and a database), with a private home dir.

    The home's credentials.json holds each service's own user on `server`, so the services a
    test starts in-process (tests/pipeline/kit.py) connect as themselves, not as the admin.
    """
    write_json(home / CREDENTIALS_FILE, {"services": server.services}, private=True)
    return Settings(
        home=home,
        nats_url=server.url,
        database_url=database_url,
        nats_user=server.user,
        nats_password=server.password,
        external_nats=external,
        external_database=database_url is not None,
    )


@pytest.fixture
async def clean_jetstream(nats_server: NatsServer) -> None:
    """Delete every stream (KV and object buckets are streams too) left by earlier tests."""
    client = await nats.connect(
        nats_server.url, user=nats_server.user, password=nats_server.password
    )
    try:
        js = client.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(info.config.name)
    finally:
        await client.close()


@pytest.fixture
async def pg_dsn(pg_server: PostgresServer) -> AsyncIterator[str]:
    """A fresh, empty database for this test (dropped afterwards)."""
    name = f"t_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(pg_server.dsn("postgres"))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield pg_server.dsn(name)
    admin = await asyncpg.connect(pg_server.dsn("postgres"))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
def nats_settings(tmp_path: Path, nats_server: NatsServer, clean_jetstream: None) -> Settings:
    """Settings for the session NATS (JetStream emptied first) and no database."""
    return settings_for(tmp_path / "home", nats_server, None)


@pytest.fixture
def settings(
    tmp_path: Path, nats_server: NatsServer, clean_jetstream: None, pg_dsn: str
) -> Settings:
    """Settings for the session NATS (JetStream emptied first) and a fresh database."""
    return settings_for(tmp_path / "home", nats_server, pg_dsn)


@pytest.fixture
async def nats_client(nats_settings: Settings) -> AsyncIterator[nats.aio.client.Client]:
    """A connected nats-py client on the session server, JetStream emptied first."""
    client = await connect_nats(nats_settings)
    yield client
    await client.close()


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test's own (e.g. to stop and restart it); `.stop()`/`.start()`."""
    server = start_nats(tmp_path / "fresh-nats", port=0, monitor_port=0, attached=True)
    yield server
    server.stop()


@pytest.fixture
def fresh_nats_settings(tmp_path: Path, fresh_nats: NatsServer, pg_dsn: str) -> Settings:
    """Settings on this test's own nats-server (`fresh_nats`) and the session's Postgres."""
    return settings_for(tmp_path / "home", fresh_nats, pg_dsn)


@pytest.fixture
def nats_cluster(servers_root: Path) -> Iterator[NatsCluster]:
    """Three nats-servers clustered on loopback (R3 streams), ready once JetStream has a meta
    leader every node agrees on; a test may SIGKILL and restart its nodes (`.nodes[i]`)."""
    home = Path(tempfile.mkdtemp(prefix="cluster-", dir=servers_root))
    cluster = start_nats_cluster(home, 3, any_port=True, attached=True)
    yield cluster
    cluster.stop()


@pytest.fixture
def make_cluster_settings(
    tmp_path: Path, nats_cluster: NatsCluster
) -> Callable[[str | None], Settings]:
    """Settings for every node of the test's cluster (clients fail over between them), R3,
    with the database given (or none)."""
    home = tmp_path / "home"
    write_json(home / CREDENTIALS_FILE, {"services": nats_cluster.services}, private=True)

    def make(database_url: str | None) -> Settings:
        return Settings(
            home=home,
            nats_url=nats_cluster.url,
            nats_urls=tuple(nats_cluster.urls),
            stream_replicas=nats_cluster.replicas,
            database_url=database_url,
            nats_user=nats_cluster.user,
            nats_password=nats_cluster.password,
            external_nats=True,
            external_database=database_url is not None,
        )

    return make


@pytest.fixture
def cluster_nats_settings(make_cluster_settings: Callable[[str | None], Settings]) -> Settings:
    """Settings for the test's cluster (every node, R3) and no database."""
    return make_cluster_settings(None)


@pytest.fixture
def cluster_settings(
    make_cluster_settings: Callable[[str | None], Settings], pg_dsn: str
) -> Settings:
    """Settings for the test's cluster (every node, R3) and a fresh database."""
    return make_cluster_settings(pg_dsn)
