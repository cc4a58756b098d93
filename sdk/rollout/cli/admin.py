"""`rollout admin ...`: operator commands (rebuild the read models from the log)."""

from __future__ import annotations

import argparse
import asyncio

from rollout.cli._common import print_json, require_database, settings_or_error
from rollout.services.tracker.projections import ReadModels
from rollout.shared.bus.streams import ensure_streams
from rollout.shared.settings import connect_nats
from rollout.shared.store.db import create_pool, migrate
from rollout.shared.store.projection import ProjectionRunner


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `admin` verbs."""
    admin = sub.add_parser("admin", help="operator commands")
    verbs = admin.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND")
    rebuild = verbs.add_parser("rebuild", help="drop the read models and replay them from the log")
    rebuild.add_argument("--json", action="store_true")
    rebuild.set_defaults(func=_rebuild)


async def rebuild_read_models() -> int:
    """Rebuild the tracker's read models; return the number of events applied."""
    settings = settings_or_error()
    dsn = require_database(settings)
    nc = await connect_nats(settings)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        pool = await create_pool(dsn)
        try:
            await migrate(pool)
            return await ProjectionRunner(pool, ReadModels()).rebuild(js)
        finally:
            await pool.close()
    finally:
        await nc.close()


def _rebuild(args: argparse.Namespace) -> int:
    applied = asyncio.run(rebuild_read_models())
    if args.json:
        print_json({"events_applied": applied})
    else:
        print(f"read models rebuilt from {applied} events")
    return 0
