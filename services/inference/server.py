"""A served model in this event loop: uvicorn on a bound socket, following the policy's versions."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from rollout.services.inference.app import KeyRing, ServeConfig, create_app
from rollout.services.inference.exposure import check_exposure
from rollout.services.inference.policy import DEFAULT_MAX_BATCH, ServedPolicy
from rollout.shared.errors import RolloutError
from rollout.shared.models.base import ModelBackend
from rollout.shared.models.catalog import resolve_backend
from rollout.shared.observability import get_logger
from rollout.shared.settings import Settings, connect_nats

# How long to wait before trying to reach the stack again when it is not up (yet).
RECONNECT_S = 10.0

log = get_logger(__name__)
# How long a shutdown waits for the policy follower to end.
SHUTDOWN_WAIT_S = 10.0


@dataclass
class Running:
    """A server serving in this event loop."""

    url: str
    config: ServeConfig
    policy: ServedPolicy
    server: uvicorn.Server
    task: asyncio.Task[None]
    follower: asyncio.Task[None] | None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (`.../v1`)."""
        return f"{self.url}/v1"

    @property
    def actor_model(self) -> str:
        """The model name that makes actors use this server."""
        return f"{self.base_url}#{self.config.model}"


def _url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def follow_updates(
    policy: ServedPolicy, settings_for: Callable[[], Settings], *, retry_s: float = RECONNECT_S
) -> None:
    """Follow the lineage's `policy.updated` on the stack, reconnecting until cancelled."""
    warned = False
    while True:
        try:
            nc = await connect_nats(settings_for())
        except RolloutError as exc:
            if not warned:
                log.warning(
                    "no stack reachable: serving the loaded version, not following new ones "
                    "until it is",
                    model=policy.lineage,
                    error=str(exc),
                )
                warned = True
            await asyncio.sleep(retry_s)
            continue
        log.info("following policy updates", model=policy.lineage, version=policy.version)
        try:
            await policy.follow(nc.jetstream())
        finally:
            await nc.close()


@contextlib.asynccontextmanager
async def serving(
    model: str | ModelBackend,
    sock: socket.socket,
    *,
    name: str | None = None,
    aliases: tuple[str, ...] = (),
    keys: KeyRing | None = None,
    follow: Callable[[], Settings] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    **limits: Any,
) -> AsyncIterator[Running]:
    """Serve `model` (a name, or a backend already built) on `sock` while inside the block.

    `follow` gives the settings of the stack whose `policy.updated` events to follow (None:
    serve the loaded version only)."""
    host = sock.getsockname()[0]
    check_exposure(host, keys)
    if isinstance(model, str):
        backend = await asyncio.to_thread(resolve_backend, model)
        served = name or model
    else:
        backend = model
        served = name or getattr(model, "name", "model")
    policy = ServedPolicy(backend, max_batch=max_batch)
    config = ServeConfig(model=served, aliases=aliases, keys=keys, **limits)
    policy.start()
    app = create_app(policy, config)
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5,
            access_log=False,
        )
    )  # fmt: skip
    task = asyncio.create_task(server.serve(sockets=[sock]), name="serve-model")
    follower = None
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RolloutError("the server stopped while starting")
            await asyncio.sleep(0.02)
        if follow is not None and policy.lineage is not None:
            follower = asyncio.create_task(follow_updates(policy, follow), name="policy-follow")
        yield Running(_url_of(sock), config, policy, server, task, follower)
    finally:
        if follower is not None:
            follower.cancel()
            # Bounded: a follower whose cancel a NATS request swallowed (shared/bus/cancels.py)
            # must not keep the server, or a test that serves it, from ending.
            done, _ = await asyncio.wait({follower}, timeout=SHUTDOWN_WAIT_S)
            if not done:
                log.warning("the policy follower did not stop; shutting down without it")
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await policy.aclose()
