"""Serve the viewer with uvicorn on a socket bound up front, so its URL is known before it runs."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from rollout.services.ui.app import create_app
from rollout.shared.auth.keys import ApiKey
from rollout.shared.errors import RolloutError
from rollout.shared.service.sockets import url_of
from rollout.shared.settings import Settings
from rollout.shared.store.trajectories import object_store

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8321


class ViewerServer(uvicorn.Server):
    """uvicorn, ending the viewer's live streams first so a shutdown does not wait on them."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Close the live hub, then shut down as uvicorn does."""
        hub = self.config.app.state.ui.hub
        if hub is not None:
            hub.close()
        await super().shutdown(sockets)


def server_for(app: Any) -> ViewerServer:
    """A quiet uvicorn server for the viewer app."""
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2, access_log=False
    )
    return ViewerServer(config)


async def start_in_loop(
    app: Any, sock: socket.socket, limit_s: float = 20.0
) -> tuple[ViewerServer, asyncio.Task[None]]:
    """Serve `app` on `sock` as a task of this loop; return once it accepts connections."""
    server = server_for(app)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="rollout-ui")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not server.started:
        if task.done():
            task.result()
            raise RolloutError("the viewer stopped while starting")
        if loop.time() > deadline:
            task.cancel()
            raise RolloutError(f"the viewer did not start within {limit_s:.0f}s")
        await asyncio.sleep(0.02)
    return server, task


async def serve_ui(
    settings: Settings,
    sock: socket.socket,
    *,
    login_key: ApiKey | None = None,
    announce: Callable[[str], None] = lambda url: None,
) -> None:
    """Run the viewer on `sock` until cancelled; `announce` gets the URL to open (with a one-time
    login token for `login_key`, once the server has accepted that key)."""
    store = object_store(settings)
    app = create_app(settings, store=store)
    url = url_of(sock)
    if login_key is not None:
        auth = app.state.ui.auth
        viewer = await auth.check_key(login_key.text)
        url = f"{url}/login?token={auth.one_time_token(viewer)}"
    server = server_for(app)
    announce(url)
    try:
        await server.serve(sockets=[sock])
    finally:
        await store.close()
