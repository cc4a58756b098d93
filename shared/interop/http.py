"""uvicorn for the interop servers: on a socket bound up front, saying its URL once it listens."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from rollout.shared.service.sockets import url_of


class _Announcing(uvicorn.Server):
    """uvicorn that calls `on_listening(url)` once it accepts connections."""

    def __init__(self, config: uvicorn.Config, on_listening: Callable[[str], None]) -> None:
        super().__init__(config)
        self.on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start as uvicorn does, then say where (not before: a client may connect at once)."""
        await super().startup(sockets)
        if self.started and sockets:
            self.on_listening(url_of(sockets[0]))


def run_on(app: Any, sock: socket.socket, on_listening: Callable[[str], None]) -> None:
    """Serve `app` on `sock` in the foreground until interrupted."""
    _Announcing(uvicorn.Config(app, log_level="warning"), on_listening).run(sockets=[sock])
