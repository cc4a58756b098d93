"""Files the stack writes under ROLLOUT_HOME: atomic, and private where they hold secrets."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rollout.errors import RolloutError
from rollout.shared.settings import CREDENTIALS_FILE, read_json_file


def write_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write `text` to `path` via a temp file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp creates the file 0600 from the start: a secret never exists world-readable.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_private(path: Path, text: str) -> None:
    """Write a secret-bearing file with mode 0600, atomically."""
    write_atomic(path, text, mode=0o600)


def write_json(path: Path, data: dict[str, Any], *, private: bool = False) -> None:
    """Write a JSON object atomically (0600 when `private`)."""
    write_atomic(
        path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=0o600 if private else 0o644
    )


def load_or_create_credentials(
    home: Path, services: Iterable[str] = ()
) -> dict[str, dict[str, Any]]:
    """The embedded servers' credentials, generated once and kept in ROLLOUT_HOME (0600).

    `nats` is the unrestricted admin user (the operator's CLI, `rollout admin`); `services`
    holds one user per service named in `services` (see shared/auth/services.py). Each NATS
    entry keeps its bcrypt hash too, which is all the server config ever holds.
    """
    from rollout.shared.auth.keys import hash_secret
    from rollout.shared.auth.services import service_user

    path = home / CREDENTIALS_FILE
    creds = read_json_file(path)
    changed = False
    # nats_route: the user a cluster's servers authenticate each other's routes with.
    for server, user in (("nats", "rollout"), ("postgres", "rollout"), ("nats_route", "route")):
        entry = creds.get(server)
        if not isinstance(entry, dict) or not entry.get("user") or not entry.get("password"):
            creds[server] = {"user": user, "password": secrets.token_urlsafe(32)}
            changed = True
    users = creds.get("services")
    if not isinstance(users, dict):
        users = creds["services"] = {}
        changed = True
    for name in services:
        entry = users.get(name)
        if not isinstance(entry, dict) or not entry.get("user") or not entry.get("password"):
            users[name] = {"user": service_user(name), "password": secrets.token_urlsafe(32)}
            changed = True
    for entry in (creds["nats"], *users.values()):
        if isinstance(entry, dict) and entry.get("password") and not entry.get("password_hash"):
            entry["password_hash"] = hash_secret(entry["password"])
            changed = True
    if changed:
        write_json(path, creds, private=True)
    elif path.stat().st_mode & 0o077:
        # Someone loosened the mode: tighten it again rather than serve secrets to others.
        path.chmod(0o600)
    return creds


def ensure_home(home: Path) -> Path:
    """Create ROLLOUT_HOME and its logs folder, owner-only (Postgres later gets o+x to traverse)."""
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (home / "logs").mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise RolloutError(
            f"ROLLOUT_HOME={str(home)!r} cannot be used: {exc.strerror}",
            problems=["set ROLLOUT_HOME to a writable directory"],
        ) from exc
    return home
