"""`rollout serve NAME`: beats while running, exits 0 on SIGTERM, clear error for a bad name."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import nats.aio.client
from waiting import wait_until

from rollout.shared.stack.health import read_beats
from rollout.shared.stack.nats import NatsServer
from rollout.shared.stack.supervisor import cli_command

from .conftest import stack_env


def _external_env(home: Path, server: NatsServer) -> dict[str, str]:
    return stack_env(home) | {
        "ROLLOUT_NATS_URL": server.url,
        "ROLLOUT_NATS_USER": server.user,
        "ROLLOUT_NATS_PASSWORD": server.password,
    }


async def test_serve_beats_and_stops_on_sigterm(
    tmp_path: Path, nats_server: NatsServer, nats_client: nats.aio.client.Client
) -> None:
    proc = subprocess.Popen(  # noqa: ASYNC220 (a long-lived child, started once)
        cli_command("serve", "idle", "--replica-id", "only"),
        env=_external_env(tmp_path / "home", nats_server),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        js = nats_client.jetstream()

        async def beating() -> bool:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            return any(b.live and b.pid == proc.pid for b in await read_beats(js))

        await wait_until(beating, "the service's live heartbeat", 30)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        # A clean stop removes the beat at once instead of letting it age out.
        assert [b for b in await read_beats(js) if b.service == "idle"] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_unknown_service_is_a_clear_error(tmp_path: Path, nats_server: NatsServer) -> None:
    result = subprocess.run(
        cli_command("serve", "nope"),
        env=_external_env(tmp_path / "home", nats_server),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "unknown service 'nope'" in result.stderr
    assert "Traceback" not in result.stderr
