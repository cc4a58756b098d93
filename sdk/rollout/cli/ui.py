"""`rollout ui`: the web viewer (runs, trajectories, compare, training, replay), live."""

from __future__ import annotations

import argparse
import asyncio
import sys

from rollout.cli._common import client_settings_or_error, require_database
from rollout.errors import RolloutError
from rollout.services.ui.defaults import DEFAULT_HOST, DEFAULT_PORT
from rollout.shared.service.sockets import bind
from rollout.shared.settings import Settings, connect_nats, redact_url


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `ui` verb."""
    p = sub.add_parser("ui", help="open the web viewer of runs, trajectories and training")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on ({DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port ({DEFAULT_PORT}; 0: any)")
    p.add_argument(
        "--behind-proxy",
        metavar="ADDRESS",
        help="a TLS proxy in front connects from ADDRESS (IPs or networks, comma-separated):"
        " believe its X-Forwarded-For/-Proto (default: ROLLOUT_UI_PROXY; unset: believe none)",
    )
    p.add_argument(
        "--no-token",
        action="store_true",
        help="do not put a one-time login token for the local key in the printed URL",
    )
    p.set_defaults(func=_ui)


def _ui(args: argparse.Namespace) -> int:
    from rollout.services.ui.main import serve_ui
    from rollout.services.ui.server import trusted_proxies
    from rollout.shared.auth.keys import read_local_key

    proxies = trusted_proxies(args.behind_proxy)  # a bad address is said before anything starts
    settings = client_settings_or_error()
    require_database(settings)
    if not 0 <= args.port <= 65535:
        print(f"error: --port {args.port} is not a port (0-65535)", file=sys.stderr)
        return 2
    local = None if settings.external_nats or args.no_token else read_local_key(settings.home)
    sock = bind(args.host, args.port)
    try:
        # Before serving: the viewer's own start would report a stopped stack as a traceback.
        asyncio.run(_reachable(settings))
    except BaseException:
        sock.close()
        raise
    if args.host not in ("127.0.0.1", "::1", "localhost"):
        print(f"warning: listening on {args.host}, not only this machine", file=sys.stderr)

    def announce(url: str) -> None:
        print(f"rollout ui: open {url}", flush=True)
        if local is None:
            print("log in with an API key (`rollout keys create --role viewer`)", flush=True)

    asyncio.run(serve_ui(settings, sock, login_key=local, announce=announce, proxies=proxies))
    return 0


async def _reachable(settings: Settings) -> None:
    """Connect to NATS and the database once; a RolloutError saying which is down otherwise."""
    import asyncpg

    nc = await connect_nats(settings)
    await nc.close()
    url = settings.database_url or ""
    try:
        conn = await asyncpg.connect(url, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        where = redact_url(url)
        if settings.external_database:
            raise RolloutError(
                f"cannot reach the database at {where}: {exc}",
                problems=["check ROLLOUT_DATABASE_URL"],
            ) from None
        raise RolloutError(
            f"cannot reach the database at {where}: the local stack is not running",
            problems=["start it with `rollout up`"],
        ) from None
    await conn.close()
