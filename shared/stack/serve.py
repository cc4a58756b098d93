"""Run one service in this process: heartbeats on, SIGTERM/SIGINT cancel it gracefully."""

from __future__ import annotations

import asyncio
import signal

from rollout.shared.errors import RolloutError
from rollout.shared.observability import configure_logging, get_logger
from rollout.shared.service.bootstrap import beating
from rollout.shared.settings import Settings, load_settings
from rollout.shared.stack.health import DEFAULT_INTERVAL
from rollout.shared.stack.services import load_serve

log = get_logger(__name__)


async def run_service(
    name: str,
    settings: Settings,
    *,
    replica_id: str | None = None,
    interval: float = DEFAULT_INTERVAL,
) -> None:
    """Run service `name` until it returns or is cancelled, beating while it runs."""
    serve = load_serve(name)
    async with beating(name, settings, replica_id=replica_id, interval=interval) as replica_id:
        log.info("service starting", replica_id=replica_id)
        try:
            await serve(settings)
        finally:
            log.info("service stopped", replica_id=replica_id)


async def _main(name: str, replica_id: str | None) -> int:
    load_serve(name)  # an unknown name is the first thing to say
    # The service's own NATS user, never the admin one (see rollout.shared.auth.services).
    settings = load_settings(service=name)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    stopping = False

    def stop() -> None:
        nonlocal stopping
        stopping = True
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        await run_service(name, settings, replica_id=replica_id)
    except asyncio.CancelledError:
        if not stopping:
            raise
        return 0
    log.warning("service returned on its own")
    return 0


def serve_main(name: str, replica_id: str | None = None) -> int:
    """Entry of `rollout serve NAME`: logging configured, runs until SIGTERM."""
    configure_logging(name, force=True)
    try:
        return asyncio.run(_main(name, replica_id))
    except RolloutError:
        raise  # the CLI prints it plainly
    except Exception:
        log.exception("service crashed")
        return 1
