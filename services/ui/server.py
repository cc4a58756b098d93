"""The viewer's uvicorn server: started on a bound socket, its live streams ended on shutdown."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from rollout.shared.errors import RolloutError


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
