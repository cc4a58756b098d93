"""Serve the viewer with uvicorn on a socket bound up front, so its URL is known before it runs."""

from __future__ import annotations

import socket
from collections.abc import Callable

from rollout.services.ui.app import create_app
from rollout.services.ui.defaults import DEFAULT_HOST as DEFAULT_HOST
from rollout.services.ui.defaults import DEFAULT_PORT as DEFAULT_PORT
from rollout.services.ui.server import server_for
from rollout.shared.auth.keys import ApiKey
from rollout.shared.service.sockets import url_of
from rollout.shared.settings import Settings
from rollout.shared.store.trajectories import object_store


async def serve_ui(
    settings: Settings,
    sock: socket.socket,
    *,
    login_key: ApiKey | None = None,
    announce: Callable[[str], None] = lambda url: None,
    proxies: list[str] | None = None,
) -> None:
    """Run the viewer on `sock` until cancelled; `announce` gets the URL to open (with a one-time
    login token for `login_key`, once the server has accepted that key); forwarded headers
    count from `proxies` only (default: ROLLOUT_UI_PROXY)."""
    store = object_store(settings)
    app = create_app(settings, store=store)
    url = url_of(sock)
    if login_key is not None:
        auth = app.state.ui.auth
        viewer = await auth.check_key(login_key.text)
        url = f"{url}/login?token={auth.one_time_token(viewer, login_key.text)}"
    server = server_for(app, proxies)
    announce(url)
    try:
        await server.serve(sockets=[sock])
    finally:
        await store.close()
