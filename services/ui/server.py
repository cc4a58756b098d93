"""The viewer's uvicorn server: started on a bound socket, its live streams ended on shutdown."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from typing import Any

import uvicorn

from rollout.shared.errors import RolloutError

PROXY_ENV = "ROLLOUT_UI_PROXY"
PROXY_FLAG = "--behind-proxy"


def trusted_proxies(value: str | None = None) -> list[str]:
    """The addresses whose X-Forwarded-For/-Proto the viewer believes: `value` (the
    `--behind-proxy` flag) or ROLLOUT_UI_PROXY, comma-separated IPs or networks; [] when unset.

    Believed from anyone, a forwarded address would let any client pick the address the login
    throttle counts its refused keys under, so the headers count only from the proxy the
    operator named (and the session cookie is Secure only when that proxy says https).
    """
    source = PROXY_FLAG if value is not None else PROXY_ENV
    raw = (value if value is not None else os.environ.get(PROXY_ENV, "")).strip()
    if not raw:
        if value is not None:
            raise RolloutError(f"{source}: expected the TLS proxy's IP address, got nothing")
        return []
    trusted: list[str] = []
    for part in (p.strip() for p in raw.split(",")):
        try:
            if "/" in part:
                trusted.append(str(ipaddress.ip_network(part, strict=False)))
            else:
                trusted.append(str(ipaddress.ip_address(part)))
        except ValueError:
            raise RolloutError(
                f"{source}: {part!r} is not an IP address or network",
                problems=[
                    "name the address the TLS proxy connects to the viewer from, e.g. 127.0.0.1"
                    " (several: comma-separated; a network: 10.0.0.0/8)"
                ],
            ) from None
    return trusted


class ViewerServer(uvicorn.Server):
    """uvicorn, ending the viewer's live streams first so a shutdown does not wait on them."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Close the live hub, then shut down as uvicorn does."""
        hub = self.config.app.state.ui.hub
        if hub is not None:
            hub.close()
        await super().shutdown(sockets)


def server_for(app: Any, proxies: list[str] | None = None) -> ViewerServer:
    """A quiet uvicorn server for the viewer app, believing forwarded headers from `proxies`
    only (default: ROLLOUT_UI_PROXY; none: the peer's own address and scheme count)."""
    proxies = trusted_proxies() if proxies is None else proxies
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=2,
        access_log=False,
        # uvicorn's default believes any loopback peer (or FORWARDED_ALLOW_IPS): off unless
        # the operator named the proxy.
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies,
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
