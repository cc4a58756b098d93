"""Which endpoint and API key a Client or CLI verb uses: the one resolution for both.

Order, per value: an explicit argument (`Client(endpoint=, api_key=)`, `--endpoint`), then
ROLLOUT_ENDPOINT / ROLLOUT_API_KEY, then ~/.config/rollout/credentials (`rollout login`), then
the embedded stack in ROLLOUT_HOME (its URL and the runner key `rollout up` made). A key from
the credentials file or the local stack is only sent to the endpoint it belongs to. With no key
at all for the local stack, the stack's own credentials apply (what services use).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rollout.shared.auth.keys import ApiKey, hash_secret, local_key_path, read_local_key
from rollout.shared.auth.users import service_user
from rollout.shared.errors import RolloutError
from rollout.shared.settings import (
    CREDENTIALS_FILE,
    Settings,
    load_settings,
    read_json_file,
    redact_url,
)
from rollout.shared.stack.files import write_json

ENDPOINT_ENV = "ROLLOUT_ENDPOINT"
API_KEY_ENV = "ROLLOUT_API_KEY"
ENDPOINT_SCHEMES = ("nats", "tls", "ws", "wss")
_DEFAULT_PORTS = {"nats": 4222, "tls": 4222, "ws": 80, "wss": 443}


def credentials_path(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CONFIG_HOME/rollout/credentials`, by default ~/.config/rollout/credentials."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg else Path(env.get("HOME") or Path.home()) / ".config"
    return base / "rollout" / "credentials"


def read_credentials(env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The saved {endpoint, api_key}, or None when `rollout login` never ran."""
    path = credentials_path(env)
    data = read_json_file(path)
    if not data:
        return None
    endpoint, key = data.get("endpoint"), data.get("api_key")
    if not isinstance(endpoint, str) or not isinstance(key, str):
        raise RolloutError(
            f"{path} must hold a JSON object with string fields endpoint and api_key",
            problems=["run `rollout login` again (it rewrites the file)"],
        )
    return {"endpoint": endpoint, "api_key": key}


def save_credentials(endpoint: str, api_key: str, env: Mapping[str, str] | None = None) -> Path:
    """Write the credentials file, owner-only (0600, in a 0700 directory)."""
    path = credentials_path(env)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_json(path, {"endpoint": endpoint, "api_key": api_key}, private=True)
    except OSError as exc:
        raise RolloutError(f"cannot write {path}: {exc.strerror}") from exc
    return path


def check_endpoint(url: str, source: str) -> str:
    """A NATS URL with a host, or a clear error naming where it came from."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme in ("http", "https"):
        raise RolloutError(
            f"{source}: {redact_url(url)!r} is an HTTP URL; rollout talks NATS",
            problems=["use nats://host:4222 (or tls://, ws://, wss:// as the server exposes)"],
        )
    if parts.scheme not in ENDPOINT_SCHEMES or not parts.hostname:
        raise RolloutError(
            f"{source}: {redact_url(url)!r} is not a valid endpoint",
            problems=["expected nats://host:port (scheme one of nats, tls, ws, wss)"],
        )
    if parts.username or parts.password:
        raise RolloutError(
            f"{source}: the endpoint must not carry credentials; pass the API key instead"
        )
    return url


def same_endpoint(a: str, b: str) -> bool:
    """True when two URLs name the same server (default ports and localhost normalised)."""

    def norm(url: str) -> tuple[str, str, int]:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").lower()
        host = "127.0.0.1" if host in ("localhost", "::1") else host
        scheme = "nats" if parts.scheme == "tls" else parts.scheme
        try:
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
        except ValueError:
            port = -1
        return scheme, host, port

    return norm(a) == norm(b)


def client_settings(
    endpoint: str | None = None,
    api_key: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Settings for a Client or CLI verb: which NATS to reach and which key to present."""
    env = os.environ if env is None else env
    base = load_settings(env)
    saved = read_credentials(env)
    saved_from = str(credentials_path(env))

    chosen, chosen_from = _pick(
        (endpoint, "the endpoint argument"),
        (env.get(ENDPOINT_ENV), ENDPOINT_ENV),
        (saved and saved["endpoint"], saved_from),
    )
    key_text, key_from = _pick(
        (api_key, "the api_key argument"), (env.get(API_KEY_ENV), API_KEY_ENV)
    )
    if key_text is None and saved and (chosen is None or same_endpoint(chosen, saved["endpoint"])):
        # The saved key belongs to the saved endpoint: never send it to another server.
        key_text, key_from = saved["api_key"], saved_from
        chosen, chosen_from = chosen or saved["endpoint"], chosen_from or saved_from
    local = base.nats_url
    is_local = chosen is None or (not base.external_nats and same_endpoint(chosen, local))
    if key_text is None and is_local and not base.external_nats:
        local_key = read_local_key(base.home)
        if local_key is not None:
            key_text, key_from = local_key.text, str(local_key_path(base.home))

    if key_text is None:
        if chosen is None or same_endpoint(chosen, local):
            return base  # the local stack's own credentials (or ROLLOUT_NATS_* settings)
        raise RolloutError(
            f"no API key for {redact_url(chosen)} (endpoint from {chosen_from})",
            problems=[
                f"run `rollout login --endpoint {redact_url(chosen)}`",
                f"or set {API_KEY_ENV}",
            ],
        )
    key = ApiKey.parse(key_text, source=key_from or "the API key")
    url = check_endpoint(chosen, chosen_from or "endpoint") if chosen else local
    return replace(
        base,
        nats_url=url,
        nats_user=key.user,
        nats_password=key.secret,
        nats_token=None,
        external_nats=base.external_nats or not same_endpoint(url, local),
        endpoint_source=chosen_from or _local_source(base),
        credential_source=key_from,
    )


def with_credentials(
    settings: Settings, endpoint: str | None = None, api_key: str | None = None
) -> Settings:
    """Explicit settings with an endpoint and/or API key applied on top (Client arguments)."""
    if endpoint:
        settings = replace(
            settings,
            nats_url=check_endpoint(endpoint, "the endpoint argument"),
            external_nats=True,
            endpoint_source="the endpoint argument",
        )
    if api_key:
        key = ApiKey.parse(api_key, source="the api_key argument")
        settings = replace(
            settings,
            nats_user=key.user,
            nats_password=key.secret,
            nats_token=None,
            credential_source="the api_key argument",
        )
    return settings


def _pick(*candidates: tuple[Any, str]) -> tuple[str | None, str | None]:
    """The first non-empty value with its source."""
    for value, source in candidates:
        if value:
            return str(value), source
    return None, None


def _local_source(settings: Settings) -> str:
    return "ROLLOUT_NATS_URL" if settings.external_nats else str(settings.home / "state.json")


def describe(settings: Settings) -> dict[str, Any]:
    """Where a connection goes and as whom, safe to print (no secrets)."""
    return {
        "endpoint": redact_url(settings.nats_url),
        "endpointSource": settings.endpoint_source or _local_source(settings),
        "user": settings.nats_user,
        "credentialSource": settings.credential_source,
    }


def load_or_create_credentials(
    home: Path, services: Iterable[str] = ()
) -> dict[str, dict[str, Any]]:
    """The embedded servers' credentials, generated once and kept in ROLLOUT_HOME (0600).

    `nats` is the unrestricted admin user (the operator's CLI, `rollout admin`); `services`
    holds one user per service named in `services` (see shared/auth/services.py). Each NATS
    entry keeps its bcrypt hash too, which is all the server config ever holds.
    """
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
