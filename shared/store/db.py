"""Postgres connections and ordered SQL migrations applied at start."""

from __future__ import annotations

import asyncio
import re
from importlib import resources
from pathlib import Path

import asyncpg

_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# Any fixed number: serialises concurrent starters that would otherwise race on DDL.
_MIGRATION_LOCK = 7_310_215


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A connection pool to the read-model database."""
    return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size)


def migration_files() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every migration, in order."""
    folder = resources.files("rollout.shared.store") / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    found.sort()
    versions = [v for v, _, _ in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions in {Path(str(folder))}")
    return found


async def migrate(pool: asyncpg.Pool) -> list[str]:
    """Apply every migration not yet applied, each in its own transaction; return their names."""
    applied: list[str] = []
    async with pool.acquire() as conn:
        await conn.execute("select pg_advisory_lock($1)", _MIGRATION_LOCK)
        try:
            await conn.execute(
                "create table if not exists schema_migrations ("
                " version int primary key, name text not null,"
                " applied_at timestamptz not null default now())"
            )
            done = {r["version"] for r in await conn.fetch("select version from schema_migrations")}
            for version, name, sql in migration_files():
                if version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute(
                        "insert into schema_migrations(version, name) values ($1, $2)",
                        version,
                        name,
                    )
                applied.append(name)
        finally:
            await conn.execute("select pg_advisory_unlock($1)", _MIGRATION_LOCK)
    return applied


async def close_pool(pool: asyncpg.Pool, *, timeout_s: float = 10.0) -> None:
    """Close gracefully; at shutdown a connection cut mid-query is terminated, not raised."""
    try:
        await asyncio.wait_for(pool.close(), timeout_s)
    except (TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError):
        pool.terminate()
