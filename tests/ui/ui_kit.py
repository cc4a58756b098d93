"""The viewer served by uvicorn inside a test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from rollout.services.ui.app import create_app
from rollout.services.ui.server import start_in_loop
from rollout.shared.auth.keys import ApiKey
from rollout.shared.service.sockets import bind, url_of
from rollout.shared.settings import Settings
from rollout.shared.store.trajectories import object_store

# The longest a viewer may take to stop: well past its own shutdown limits (server.py, app.py).
STOP_LIMIT_S = 60.0


@dataclass
class UiServer:
    """The viewer on a free loopback port."""

    url: str
    app: Any

    async def session_cookie(self, key: ApiKey) -> str:
        """A session cookie for `key`, as logging in with it gives (the key proven by NATS)."""
        auth = self.app.state.ui.auth
        viewer = auth.open_session(await auth.check_key(key.text), key.text)
        return self.app.state.ui.signer.sign(viewer)

    async def login_link(self, key: ApiKey) -> str:
        """A one-time login URL for `key`, as `rollout ui` prints it for the local key."""
        auth = self.app.state.ui.auth
        viewer = await auth.check_key(key.text)
        return f"{self.url}/login?token={auth.one_time_token(viewer, key.text)}"


@contextlib.asynccontextmanager
async def serve(settings: Settings) -> AsyncIterator[UiServer]:
    """Run the viewer against `settings` until the block ends."""
    sock = bind("127.0.0.1", 0)
    store = object_store(settings)
    app = create_app(settings, store=store)
    server, task = await start_in_loop(app, sock)
    try:
        yield UiServer(url=url_of(sock), app=app)
    finally:
        server.should_exit = True
        try:
            # A viewer that does not stop fails here, saying so, not at pytest's timeout.
            await asyncio.wait_for(task, STOP_LIMIT_S)
        except TimeoutError:
            raise AssertionError(f"the viewer did not stop within {STOP_LIMIT_S:.0f} s") from None
        finally:
            sock.close()
            await store.close()
