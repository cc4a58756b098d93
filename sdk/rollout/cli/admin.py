"""`rollout admin ...`: operator commands (rebuild the read models from the log)."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from rollout.cli._common import port_number, print_json, require_database, settings_or_error
from rollout.errors import RolloutError
from rollout.shared.settings import connect_nats
from rollout.shared.stack.files import write_atomic
from rollout.shared.stack.services import SERVICES

# What nats-config writes begins with one of these (the whole config, or --terraform-template's
# authorization block) and holds the users block; a file of another shape is the user's own.
_CONFIG_STARTS = ("listen: ", "authorization {\n")
_USERS_BLOCK = "authorization {\n  users = [\n"
# The largest config we expect: one user per service and many permissions, well under this.
_CONFIG_LIMIT = 1 << 20


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `admin` verbs."""
    admin = sub.add_parser("admin", help="operator commands")
    verbs = admin.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND")
    rebuild = verbs.add_parser("rebuild", help="drop the read models and replay them from the log")
    rebuild.add_argument("--json", action="store_true")
    rebuild.set_defaults(func=_rebuild)
    config = verbs.add_parser(
        "nats-config",
        help="write a deployment's nats-server config: the admin and one user per service",
        description="Passwords come from ROLLOUT_NATS_PASSWORD (admin) and"
        " ROLLOUT_NATS_PASSWORD_<SERVICE> (one per service); the file keeps only bcrypt hashes.",
    )
    config.add_argument("--out", required=True, help="where to write the config")
    config.add_argument("--listen", default="0.0.0.0")
    config.add_argument("--port", type=port_number, default=4222)
    config.add_argument("--http-port", type=int, default=8222)
    config.add_argument("--store-dir", default="/data")
    config.add_argument(
        "--server-name",
        default="rollout-nats",
        help="this node's server_name (unique per node of a cluster, e.g. the pod name)",
    )
    config.add_argument(
        "--terraform-template",
        action="store_true",
        help="write only the authorization block, with Terraform template variables in place of"
        " the password hashes (infra/terraform/nats-authorization.tftpl); needs no password",
    )
    config.set_defaults(func=_nats_config)


async def rebuild_read_models() -> int:
    """Rebuild the tracker's read models; return the number of events applied."""
    from rollout.services.tracker.projections import ReadModels
    from rollout.shared.bus.streams import ensure_streams
    from rollout.shared.store.db import create_pool, migrate
    from rollout.shared.store.projection import ProjectionRunner

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


def is_earlier_nats_config(path: Path) -> bool:
    """PATH holds what an earlier `rollout admin nats-config` wrote (so replacing it loses none)."""
    try:
        with path.open(encoding="utf-8") as f:
            text = f.read(_CONFIG_LIMIT)
    except (OSError, UnicodeDecodeError):
        return False
    return text.startswith(_CONFIG_STARTS) and _USERS_BLOCK in text


def _nats_config(args: argparse.Namespace) -> int:
    from rollout.shared.auth.services import authorization_template
    from rollout.shared.stack.nats import deployment_config
    from rollout.snapshots import check_out_file

    out = Path(args.out)
    what = "nats-config writes one config file"
    check_out_file(out, "--out", "admin nats-config", is_earlier_nats_config, what=what)
    if args.terraform_template:
        try:
            write_atomic(out, authorization_template(list(SERVICES)), mode=0o644)
        except OSError as exc:
            raise RolloutError(f"cannot write {out}: {exc.strerror}") from exc
        print(f"wrote {out} (admin and {len(SERVICES)} service users, hashes as variables)")
        return 0
    text = deployment_config(
        os.environ,
        services=list(SERVICES),
        listen=args.listen,
        port=args.port,
        http_port=args.http_port,
        store_dir=args.store_dir,
        server_name=args.server_name,
    )
    try:
        # Hashes only, no password: readable by the nats-server container's user.
        write_atomic(out, text, mode=0o644)
    except OSError as exc:
        raise RolloutError(f"cannot write {out}: {exc.strerror}") from exc
    print(f"wrote {out} (admin and {len(SERVICES)} service users)")
    return 0
