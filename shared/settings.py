"""Resolved settings: where rollout keeps its data and which NATS and Postgres it talks to."""

from __future__ import annotations

import json
import math
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from rollout.shared import subjects
from rollout.shared.errors import RolloutError

if TYPE_CHECKING:
    import nats.aio.client

# File names inside ROLLOUT_HOME; the stack launcher writes them, settings only read them.
STATE_FILE = "state.json"
CREDENTIALS_FILE = "credentials.json"
# The operator's model endpoint allow-list (see rollout.shared.models.endpoints); the
# ROLLOUT_MODEL_ENDPOINTS setting points elsewhere.
MODEL_ENDPOINTS_FILE = "model_endpoints.toml"

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
# JetStream's limit on a stream's replicas (R5 survives two lost servers).
MAX_STREAM_REPLICAS = 5
# API keys (see rollout.shared.auth.keys) are NATS users named `rk_<role>_<id>`.
API_KEY_PREFIX = "rk_"
# Each service's own NATS user is `svc_<service>` (see rollout.shared.auth.services).
SERVICE_USER_PREFIX = "svc_"


@dataclass(frozen=True)
class Settings:
    """Everything a process needs to reach the bus and the database."""

    home: Path
    nats_url: str
    database_url: str | None
    nats_user: str | None = None
    nats_password: str | None = None
    nats_token: str | None = None
    external_nats: bool = False
    external_database: bool = False
    # Where the NATS URL and the credentials came from, named in connection errors.
    endpoint_source: str | None = None
    credential_source: str | None = None
    # Every server of a cluster (nats_url is the first); empty for a single server.
    nats_urls: tuple[str, ...] = ()
    # Replicas of the streams and buckets this process creates: 3 on a cluster, 1 alone.
    stream_replicas: int = 1
    # ROLLOUT_NATS_CA_FILE: the CA that signs the NATS servers' certificates (a private CA,
    # as on Kubernetes), trusted for NATS alone so other TLS keeps the system's roots.
    nats_ca_file: str | None = None

    @property
    def nats_servers(self) -> list[str]:
        """The server URLs a client is given (it fails over between them)."""
        return list(self.nats_urls) or [self.nats_url]

    @property
    def api_key_user(self) -> str | None:
        """The NATS user when connecting with an API key (`rk_<role>_<id>`), else None."""
        user = self.nats_user
        return user if user is not None and user.startswith(API_KEY_PREFIX) else None

    def with_database(self, database_url: str) -> Settings:
        """A copy pointing at another database (tests use one database each)."""
        return replace(self, database_url=database_url)


def default_home(env: Mapping[str, str] | None = None) -> Path:
    """The per-user data dir: $XDG_DATA_HOME/rollout or ~/.local/share/rollout."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path(env.get("HOME") or Path.home()) / ".local" / "share"
    return base / "rollout"


def read_json_file(path: Path) -> dict[str, Any]:
    """Read a JSON object from a file rollout wrote; a missing file reads as {}."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise RolloutError(
            f"cannot read {path}: {exc.strerror}",
            problems=["check ROLLOUT_HOME (a writable directory; default ~/.local/share/rollout)"],
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RolloutError(
            f"{path} is not valid JSON ({exc}); delete it and run `rollout up`"
        ) from exc
    if not isinstance(data, dict):
        raise RolloutError(f"{path} must hold a JSON object; delete it and run `rollout up`")
    return data


def load_settings(env: Mapping[str, str] | None = None, *, service: str | None = None) -> Settings:
    """Resolve settings from the environment, then from the embedded stack's files in the home.

    With `service` (what `rollout serve NAME` runs), the embedded stack's credential of that
    service is used instead of the admin one; an external NATS takes ROLLOUT_NATS_USER and
    ROLLOUT_NATS_PASSWORD as given (a deployment gives each service its own).
    """
    env = os.environ if env is None else env
    home = Path(env["ROLLOUT_HOME"]).expanduser() if env.get("ROLLOUT_HOME") else default_home(env)
    state = read_json_file(home / STATE_FILE)
    creds = read_json_file(home / CREDENTIALS_FILE)

    external_nats = bool(env.get("ROLLOUT_NATS_URL"))
    nats_urls: tuple[str, ...] = ()
    if external_nats:
        # A cluster is a comma-separated list: the client fails over between its servers.
        nats_urls = tuple(
            _checked_url(part.strip(), "ROLLOUT_NATS_URL", ("nats", "tls", "ws", "wss"))
            for part in env["ROLLOUT_NATS_URL"].split(",")
            if part.strip()
        )
        if not nats_urls:
            raise RolloutError("ROLLOUT_NATS_URL names no server")
        nats_url = nats_urls[0]
        nats_urls = nats_urls if len(nats_urls) > 1 else ()
        nats_user = env.get("ROLLOUT_NATS_USER") or None
        nats_password = env.get("ROLLOUT_NATS_PASSWORD") or None
        nats_token = env.get("ROLLOUT_NATS_TOKEN") or None
    else:
        nats_url = str(state.get("nats", {}).get("url") or DEFAULT_NATS_URL)
        nats_urls = tuple(str(url) for url in state.get("nats", {}).get("urls") or ())
        nats_creds = creds.get("nats", {})
        if service is not None:
            nats_creds = _service_credentials(home, creds, service)
        nats_user = nats_creds.get("user")
        nats_password = nats_creds.get("password")
        nats_token = None

    external_database = bool(env.get("ROLLOUT_DATABASE_URL"))
    if external_database:
        database_url: str | None = _checked_url(
            env["ROLLOUT_DATABASE_URL"], "ROLLOUT_DATABASE_URL", ("postgresql", "postgres")
        )
    else:
        database_url = state.get("postgres", {}).get("url") or None

    return Settings(
        home=home,
        nats_url=nats_url,
        database_url=database_url,
        nats_user=nats_user,
        nats_password=nats_password,
        nats_token=nats_token,
        external_nats=external_nats,
        external_database=external_database,
        nats_urls=nats_urls,
        stream_replicas=stream_replicas(env, state, home),
        nats_ca_file=env.get("ROLLOUT_NATS_CA_FILE") or None,
    )


def stream_replicas(env: Mapping[str, str], state: Mapping[str, Any], home: Path) -> int:
    """ROLLOUT_STREAM_REPLICAS, else what the embedded stack runs (3 as a cluster), else 1."""
    raw = env.get("ROLLOUT_STREAM_REPLICAS")
    if raw:
        if not raw.strip().isdigit() or not 1 <= int(raw) <= MAX_STREAM_REPLICAS:
            raise RolloutError(
                f"ROLLOUT_STREAM_REPLICAS={raw!r} is not a replica count",
                problems=[f"expected 1 to {MAX_STREAM_REPLICAS} (3 on a 3-node cluster)"],
            )
        return int(raw)
    recorded = (state.get("nats") or {}).get("replicas")
    if recorded is None:
        return 1
    if not isinstance(recorded, int) or not 1 <= recorded <= MAX_STREAM_REPLICAS:
        raise RolloutError(
            f"{home / STATE_FILE} records nats.replicas={recorded!r}; run `rollout up` again"
        )
    return recorded


def _service_credentials(home: Path, creds: dict[str, Any], service: str) -> dict[str, Any]:
    """One service's own NATS user from credentials.json, or a clear error."""
    entry = (creds.get("services") or {}).get(service)
    if not isinstance(entry, dict) or not entry.get("user") or not entry.get("password"):
        raise RolloutError(
            f"{home / CREDENTIALS_FILE} holds no NATS credential for service {service!r}",
            problems=[
                "`rollout up` creates one per service (restart it after adding a service)",
                "or point the service at a NATS of your own: ROLLOUT_NATS_URL,"
                " ROLLOUT_NATS_USER, ROLLOUT_NATS_PASSWORD",
            ],
        )
    return entry


def _checked_url(url: str, variable: str, schemes: tuple[str, ...]) -> str:
    """Reject a URL with the wrong scheme or no host, naming the variable it came from."""
    parts = urlsplit(url)
    if parts.scheme not in schemes or not parts.hostname:
        raise RolloutError(
            f"{variable}={redact_url(url)!r} is not a valid URL",
            problems=[f"expected {schemes[0]}://host:port (scheme one of {', '.join(schemes)})"],
        )
    return url


def redact_url(url: str) -> str:
    """The URL with any password replaced, safe to print and log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def nats_connect_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for nats-py `connect` and FastStream's `NatsBroker`."""
    kwargs: dict[str, Any] = {"servers": settings.nats_servers}
    if settings.nats_token:
        kwargs["token"] = settings.nats_token
    if settings.nats_user is not None:
        kwargs["user"] = settings.nats_user
        kwargs["password"] = settings.nats_password or ""
    prefix = inbox_prefix_of(settings)
    if prefix:
        kwargs["inbox_prefix"] = prefix
    tls = nats_tls_context(settings)
    if tls is not None:
        kwargs["tls"] = tls
    return kwargs


def nats_tls_context(settings: Settings) -> ssl.SSLContext | None:
    """A TLS context trusting ROLLOUT_NATS_CA_FILE for the NATS connection, else None."""
    if not settings.nats_ca_file:
        return None
    try:
        return ssl.create_default_context(cafile=settings.nats_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise RolloutError(
            f"ROLLOUT_NATS_CA_FILE={settings.nats_ca_file!r} is not a readable CA certificate:"
            f" {getattr(exc, 'strerror', None) or exc}",
            problems=["point it at the PEM file of the CA that signs the NATS certificates"],
        ) from exc


def inbox_prefix_of(settings: Settings) -> str | None:
    """The private reply prefix of a key's or a service's user (they may subscribe only there)."""
    user = settings.nats_user
    if user and user.startswith((API_KEY_PREFIX, SERVICE_USER_PREFIX)):
        return subjects.inbox_prefix(user)
    return None


async def connect_nats(settings: Settings, **options: Any) -> nats.aio.client.Client:
    """Connect to the configured NATS with its credentials; a clear error when it is not there."""
    import nats
    import nats.errors

    kwargs = nats_connect_kwargs(settings)
    kwargs.setdefault("connect_timeout", 5)
    kwargs.update(options)
    # Once connected, a long-lived process rides out any NATS restart (-1: never give up).
    later = {
        "allow_reconnect": kwargs.pop("allow_reconnect", True),
        "max_reconnect_attempts": kwargs.pop("max_reconnect_attempts", -1),
        "reconnect_time_wait": kwargs.pop("reconnect_time_wait", 2.0),
    }
    source = settings.endpoint_source or (
        "ROLLOUT_NATS_URL" if settings.external_nats else f"{settings.home / STATE_FILE}"
    )
    connected = False
    user_error_cb = kwargs.pop("error_cb", None)

    async def on_error(exc: Exception) -> None:
        # nats-py's default prints a traceback per failed attempt; a failed first connect is
        # reported once below, and later drops are logged as one line. A caller's callback
        # (e.g. the Client failing a refused request fast) sees every error too.
        denied = is_permission_violation(exc)
        if connected and not (denied and user_error_cb is not None):
            import structlog

            log = structlog.get_logger(__name__)
            if denied:
                log.warning("nats permission denied", user=settings.nats_user, error=str(exc))
            else:
                log.warning("nats connection error", error=str(exc))
        if user_error_cb is not None:
            await user_error_cb(exc)

    kwargs["error_cb"] = on_error
    try:
        # nats-py applies its reconnect policy to the first connect too, retrying an absent
        # server or a wrong password for minutes. The first connect gets one quick retry;
        # nats-py reads these options afresh on every reconnect, so the policy is restored after.
        client = await nats.connect(
            allow_reconnect=False, max_reconnect_attempts=1, reconnect_time_wait=0.05, **kwargs
        )
        client.options.update(later)
        connected = True
        return client
    except (nats.errors.NoServersError, OSError, TimeoutError) as exc:
        where = ", ".join(redact_url(url) for url in settings.nats_servers)
        if not settings.external_nats:
            # The address is the embedded stack's own: it is down (or was never started),
            # and no endpoint setting would bring it back.
            raise NatsUnreachable(
                f"cannot reach NATS at {where} (from {source}): the local stack is not running",
                problems=[
                    "start it with `rollout up` (or set ROLLOUT_ENDPOINT / `rollout login` "
                    "to use a deployment)"
                ],
            ) from exc
        raise NatsUnreachable(
            f"cannot reach NATS at {where} (from {source}): {exc}",
            problems=["check ROLLOUT_NATS_URL, or start the embedded stack with `rollout up`"]
            if not settings.api_key_user
            else ["check the endpoint (`rollout login --endpoint URL`, or ROLLOUT_ENDPOINT)"],
        ) from exc
    except nats.errors.Error as exc:
        raise refused_error(settings, exc) from exc


class NatsUnreachable(RolloutError):
    """No NATS server answered (as opposed to one refusing the credentials)."""


def is_permission_violation(exc: BaseException) -> bool:
    """True for nats-server's asynchronous `Permissions Violation` error."""
    return "permissions violation" in str(exc).lower()


def refused_error(settings: Settings, exc: BaseException) -> RolloutError:
    """The error for a server that refused our credentials, saying where they came from."""
    url = redact_url(settings.nats_url)
    if settings.api_key_user:
        source = settings.credential_source or "the API key"
        return RolloutError(
            f"NATS at {url} refused API key {settings.api_key_user} (from {source}): {exc}",
            problems=[
                "the key is mistyped or was revoked (`rollout keys list` on the server)",
                "log in with a valid key: `rollout login`, or set ROLLOUT_API_KEY",
            ],
        )
    return RolloutError(
        f"NATS at {url} refused the connection: {exc}",
        problems=[
            "with an API key: `rollout login`, or set ROLLOUT_API_KEY and ROLLOUT_ENDPOINT",
            "embedded: credentials come from ROLLOUT_HOME/credentials.json",
            "external: set ROLLOUT_NATS_USER and ROLLOUT_NATS_PASSWORD, or ROLLOUT_NATS_TOKEN",
        ],
    )


def env_number(
    name: str,
    default: float,
    *,
    whole: bool = False,
    unit: str = "",
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    env: Mapping[str, str] | None = None,
) -> float:
    """A numeric knob from the environment: the one rule every service's settings follow.

    Unset or blank gives `default`; otherwise the value must parse (as a whole number with
    `whole`) and lie in [low, high] (and be > `above`), or a RolloutError names the variable,
    what it must be and what it got.
    """
    env = os.environ if env is None else env
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    what = f"a {'whole ' if whole else ''}number" + (f" of {unit}" if unit else "")
    try:
        value: float = int(raw) if whole else float(raw)
    except ValueError:
        raise RolloutError(f"{name} must be {what}, got {raw!r}") from None
    if not math.isfinite(value):
        # nan passes every range check below (each comparison is false), and inf is no budget.
        raise RolloutError(f"{name} must be a finite number, got {raw!r}")
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    if above is not None and not value > above:
        raise RolloutError(f"{name} must be > {above:g}, got {shown}")
    if low is not None and high is not None and not low <= value <= high:
        raise RolloutError(f"{name} must be between {low:g} and {high:g} {unit}".rstrip()
                           + f", got {shown}")  # fmt: skip
    if low is not None and value < low:
        raise RolloutError(f"{name} must be >= {low:g}, got {shown}")
    if high is not None and value > high:
        raise RolloutError(f"{name} must be <= {high:g}, got {shown}")
    return value
