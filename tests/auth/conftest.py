"""Fixtures: a nats-server of the auth tests' own (keys reload it), services in-process, keys."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from waiting import wait_until

from rollout.client import AsyncClient
from rollout.errors import RolloutError
from rollout.shared.auth.keys import ApiKey, KeyStore
from rollout.shared.auth.roles import Role
from rollout.shared.settings import Settings
from rollout.shared.stack.files import write_json
from rollout.shared.stack.nats import NatsServer, start_nats
from rollout.shared.stack.supervisor import cli_command

SERVICES = {
    "env-registry": "rollout.services.env_registry.main",
    "tracker": "rollout.services.tracker.main",
}


@pytest.fixture(scope="session")
def auth_nats(servers_root: Path) -> Iterator[NatsServer]:
    """A nats-server for these tests only: creating and revoking keys reloads it.

    Its home records it in state.json as `rollout up` would, so the CLI's `keys` verbs find
    and reload it.
    """
    home = Path(tempfile.mkdtemp(prefix="auth-", dir=servers_root))
    server = start_nats(home, port=0, monitor_port=0, attached=True)
    write_json(
        home / "state.json", {"nats": {"external": False, **server.describe()}}, private=True
    )
    yield server
    server.stop()


@pytest.fixture
async def service_settings(auth_nats: NatsServer, pg_dsn: str, tmp_path: Path) -> Settings:
    """The service user's settings on the auth server, JetStream emptied first."""
    client = await nats.connect(auth_nats.url, user=auth_nats.user, password=auth_nats.password)
    try:
        js = client.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(info.config.name)
    finally:
        await client.close()
    return Settings(
        home=tmp_path / "home",
        nats_url=auth_nats.url,
        database_url=pg_dsn,
        nats_user=auth_nats.user,
        nats_password=auth_nats.password,
        external_nats=True,
        external_database=True,
    )


@pytest.fixture
async def services(service_settings: Settings) -> AsyncIterator[None]:
    """The env registry and the tracker in this loop, answering queries."""
    tasks = [
        asyncio.create_task(importlib.import_module(module).serve(service_settings), name=name)
        for name, module in SERVICES.items()
    ]
    admin = AsyncClient(service_settings, timeout_s=5)

    async def answering() -> bool:
        try:
            await admin.list_environments()
            await admin.list_runs()
        except RolloutError:
            for task in tasks:
                if task.done():
                    task.result()  # a service that died says why
            return False
        return True

    await wait_until(answering, "the registry and the tracker to answer", 30)
    await admin.close()
    yield
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make_key(server: NatsServer, role: Role) -> ApiKey:
    """Mint a key on `server` and reload it, as `rollout keys create` does."""
    _, key = KeyStore(server.home).create(role, f"test {role.value}")
    server.reload()
    return key


@pytest.fixture
def viewer_key(auth_nats: NatsServer) -> ApiKey:
    """A fresh viewer key the server accepts."""
    return make_key(auth_nats, Role.VIEWER)


@pytest.fixture
def runner_key(auth_nats: NatsServer) -> ApiKey:
    """A fresh runner key the server accepts."""
    return make_key(auth_nats, Role.RUNNER)


def refund_env() -> dict[str, Any]:
    """A one-task workflow environment."""
    return {
        "slug": "refunds",
        "name": "Refunds",
        "template": "workflow",
        "config": {
            "tools": [
                {
                    "name": "refund",
                    "kind": "action",
                    "appendTo": "refunds",
                    "value": {"order_id": "${args.order_id}", "amount": "${args.amount}"},
                }
            ],
            "initialMutableState": {"refunds": []},
        },
        "tasks": [
            {
                "instruction": "Refund order O-1 in full",
                "hiddenGroundTruth": {"refunds": [{"order_id": "O-1", "amount": 10}]},
            }
        ],
    }


@dataclass
class Cli:
    """`rollout ...` as a subprocess with a private config dir (never the user's login)."""

    env: dict[str, str]

    async def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        """Run one command off the event loop (services in this loop must keep answering)."""
        return await asyncio.to_thread(
            subprocess.run,
            cli_command(*args),
            env=self.env,
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def cli_env(home: Path, config_home: Path, **extra: str) -> dict[str, str]:
    """The environment for the CLI: no ROLLOUT_* from outside, a private XDG config dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLOUT_", "NATS_"))}
    return env | {"ROLLOUT_HOME": str(home), "XDG_CONFIG_HOME": str(config_home)} | extra


@pytest.fixture
def cli(auth_nats: NatsServer, tmp_path: Path) -> Cli:
    """The CLI on the auth server's home (its local runner key), with no login yet."""
    return Cli(cli_env(auth_nats.home, tmp_path / "config"))
