"""`rollout up`: start the servers (unless external), then run and supervise each service."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import nats.errors

from rollout.shared.auth.services import SUPERVISOR
from rollout.shared.errors import RolloutError
from rollout.shared.observability import get_logger
from rollout.shared.settings import (
    STATE_FILE,
    Settings,
    connect_nats,
    load_settings,
    read_json_file,
    redact_url,
)
from rollout.shared.stack.files import ensure_home, write_json
from rollout.shared.stack.health import read_beat
from rollout.shared.stack.nats import NatsCluster, NatsServer, start_nats, start_nats_cluster
from rollout.shared.stack.postgres import PostgresServer, start_postgres
from rollout.shared.stack.process import ProcessRef, stop_process

log = get_logger(__name__)

LOCK_FILE = "supervisor.lock"
TOKEN_ENV = "ROLLOUT_SUPERVISOR_TOKEN"
# Restart backoff: doubles per quick crash, capped; a run this long resets it.
BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 30.0
SERVICE_STOP_TIMEOUT = 15.0
# How often a running supervisor checks that its state file is still there and its own.
STATE_CHECK_S = 1.0
# `python -c` keeps children independent of where the console script was installed.
_CLI = "import sys; from rollout.cli import main; sys.exit(main())"


def cli_command(*args: str) -> list[str]:
    """argv that runs `rollout ARGS` with this interpreter."""
    return [sys.executable, "-c", _CLI, *args]


def state_path(home: Path) -> Path:
    """Where the supervisor records what runs (0600: it holds the database URL)."""
    return home / STATE_FILE


def read_state(home: Path) -> dict[str, Any]:
    """The last recorded state ({} before the first `up`)."""
    return read_json_file(state_path(home))


@contextlib.contextmanager
def supervisor_lock(home: Path) -> Iterator[TextIO]:
    """Hold the home's supervisor lock, or fail: one supervisor per ROLLOUT_HOME."""
    handle = (home / LOCK_FILE).open("a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RolloutError(
                f"rollout is already running for {home} (see `rollout status`)"
            ) from None
        yield handle
    finally:
        handle.close()


def supervisor_running(home: Path) -> bool:
    """True while some process holds the home's supervisor lock."""
    try:
        with supervisor_lock(home):
            return False
    except RolloutError:
        return True


@dataclass
class ServiceProcess:
    """One supervised `rollout serve NAME` child."""

    name: str
    log_path: Path
    env: dict[str, str]
    proc: asyncio.subprocess.Process | None = None
    ref: ProcessRef | None = None
    replica_id: str = ""
    restarts: int = 0
    last_exit: int | None = None

    def describe(self) -> dict[str, Any]:
        """The state-file entry for this service."""
        entry: dict[str, Any] = {
            "service": self.name,
            "log": str(self.log_path),
            "replica_id": self.replica_id,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }
        return entry | (self.ref.to_dict() if self.ref and self.running else {})

    @property
    def running(self) -> bool:
        """True while the child process runs."""
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Spawn the child, appending its output to its log."""
        # A fresh replica id per start: its heartbeat key tells this run from a previous one.
        self.replica_id = f"{self.name}-{uuid.uuid4().hex[:12]}"
        with self.log_path.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *cli_command("serve", self.name, "--replica-id", self.replica_id),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=self.env,
                # Own session: terminal signals reach the supervisor only, which stops in order.
                start_new_session=True,
            )
        self.ref = ProcessRef.of(self.proc.pid)
        log.info("service started", service=self.name, pid=self.proc.pid)

    async def supervise(self, stopping: asyncio.Event, changed: Any) -> None:
        """Run the child; restart it with backoff whenever it exits before `stopping`."""
        quick_failures = 0
        while not stopping.is_set():
            await self.start()
            changed()
            assert self.proc is not None
            started = time.monotonic()
            self.last_exit = await self.proc.wait()
            if stopping.is_set():
                return
            quick_failures = 0 if time.monotonic() - started > STABLE_AFTER else quick_failures + 1
            delay = min(BACKOFF_MAX, BACKOFF_START * 2 ** max(quick_failures - 1, 0))
            self.restarts += 1
            changed()
            log.warning(
                "service exited; restarting",
                service=self.name,
                code=self.last_exit,
                restart_in_s=delay,
                log=str(self.log_path),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)

    async def stop(self) -> None:
        """SIGTERM (the service cancels itself), SIGKILL after SERVICE_STOP_TIMEOUT."""
        if not self.running:
            return
        assert self.proc is not None
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), SERVICE_STOP_TIMEOUT)
        except TimeoutError:
            log.warning("service ignored SIGTERM; killing", service=self.name)
            self.proc.kill()
            await self.proc.wait()
        log.info("service stopped", service=self.name, code=self.proc.returncode)


@dataclass
class Supervisor:
    """Starts servers and services for one ROLLOUT_HOME and keeps them running."""

    settings: Settings
    services: list[str]
    env: Mapping[str, str]
    token: str | None = None
    fast: bool = False
    # nats-servers to run: 1, or a cluster of 3 (or 5) on loopback with R3 streams.
    cluster: int = 1
    # Replicas per service (`rollout up --tracker-replicas 2`); one for any not named.
    replicas: Mapping[str, int] = field(default_factory=dict)
    nats: NatsServer | NatsCluster | None = None
    postgres: PostgresServer | None = None
    children: dict[str, ServiceProcess] = field(default_factory=dict)
    phase: str = "starting"
    error: str | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def home(self) -> Path:
        """ROLLOUT_HOME."""
        return self.settings.home

    async def run(self) -> None:
        """Start everything, report ready, supervise until SIGTERM/SIGINT, then stop in order."""
        ensure_home(self.home)
        with supervisor_lock(self.home):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stopping.set)
            tasks: list[asyncio.Task[None]] = []
            try:
                await self._start_servers()
                self._set_phase("starting")
                for name in self.services:
                    for key in replica_keys(name, self.replicas.get(name, 1)):
                        child = ServiceProcess(
                            name=name,
                            log_path=self.home / "logs" / f"{key}.log",
                            env=self._child_env(),
                        )
                        self.children[key] = child
                        tasks.append(
                            asyncio.create_task(child.supervise(self.stopping, self._save))
                        )
                for name, server in self._servers():
                    tasks.append(asyncio.create_task(self._watch_server(name, server)))
                tasks.append(asyncio.create_task(self._keep_state()))
                await self._until_healthy()
                if not self.stopping.is_set():
                    self._set_phase("ready")
                    log.info("stack ready", home=str(self.home))
                await self.stopping.wait()
            except Exception as exc:
                self.error = str(exc)
                self._set_phase("failed")
                log.error("stack failed", error=str(exc))
                raise
            finally:
                if self.phase != "failed":
                    self._set_phase("stopping")
                await self._shutdown(tasks)

    async def _start_servers(self) -> None:
        previous = read_state(self.home)
        # We hold the lock, so anything still running from the state file is an orphan of a
        # supervisor that died; a second nats-server must never share its JetStream store.
        orphans = await asyncio.to_thread(stop_recorded, previous)
        if orphans:
            log.warning("stopped leftovers of a previous run", components=orphans)
        if not self.settings.external_nats:
            check_nats_mode(self.home, self.cluster)
            if self.cluster > 1:
                self.nats = await asyncio.to_thread(
                    start_nats_cluster, self.home, self.cluster, previous=previous.get("nats")
                )
                log.info("nats cluster started", urls=self.nats.urls)
            else:
                self.nats = await asyncio.to_thread(
                    start_nats, self.home, previous=previous.get("nats"), attached=False
                )
                log.info("nats started", url=self.nats.url, pid=self.nats.ref and self.nats.ref.pid)
        if not self.settings.external_database:
            self.postgres = await asyncio.to_thread(
                start_postgres,
                self.home,
                previous=previous.get("postgres"),
                fast=self.fast,
            )
            log.info("postgres started", port=self.postgres.port)
        self._write_state()
        # Settings now resolve the embedded servers from the state file just written.
        self.settings = load_settings(self.env)

    def _servers(self) -> list[tuple[str, NatsServer | PostgresServer]]:
        """Each server process to watch: the nats-server (or each cluster node), Postgres."""
        servers: list[tuple[str, NatsServer | PostgresServer]] = []
        if isinstance(self.nats, NatsCluster):
            servers += [(node.server_name, node) for node in self.nats.nodes]
        elif self.nats is not None:
            servers.append(("nats", self.nats))
        if self.postgres is not None:
            servers.append(("postgres", self.postgres))
        return servers

    async def _watch_server(self, name: str, server: NatsServer | PostgresServer) -> None:
        """Restart a server that died on its own (same port and data), with backoff."""
        quick_failures = 0
        while True:
            process = server.process
            if process is None:
                return
            started = time.monotonic()
            code = await asyncio.to_thread(process.wait)
            if self.stopping.is_set():
                return
            quick_failures = 0 if time.monotonic() - started > STABLE_AFTER else quick_failures + 1
            delay = min(BACKOFF_MAX, BACKOFF_START * 2 ** max(quick_failures - 1, 0))
            log.error("server exited; restarting", server=name, code=code, restart_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
                return
            try:
                await asyncio.to_thread(server.start)
            except RolloutError as exc:
                log.error("server restart failed", server=name, error=str(exc))
            self._save()

    async def _keep_state(self) -> None:
        """Write the state file again whenever it is gone or not this supervisor's.

        `status`, `up` and `down` find the stack through it: one deleted or broken by hand
        would leave a running stack that they call stopped and cannot stop.
        """
        said = False  # once per loss, not every second while it cannot be written
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), STATE_CHECK_S)
            if self.stopping.is_set() or self._state_is_mine():
                said = False
                continue
            if not said:
                log.warning("the state file was gone or not this supervisor's; writing it again")
            said = True
            self._save()

    def _state_is_mine(self) -> bool:
        try:
            state = read_state(self.home)
        except RolloutError:
            return False
        return (state.get("supervisor") or {}).get("pid") == os.getpid()

    async def _until_healthy(self) -> None:
        """Wait until every service has a live heartbeat from the process we started."""
        if not self.children:
            return
        # Its own user (heartbeats only), not the admin one: the supervisor runs for days.
        own = (
            self.settings
            if self.settings.external_nats
            else load_settings(self.env, service=SUPERVISOR)
        )
        nc = await connect_nats(own, name="rollout-supervisor")
        try:
            js = nc.jetstream()
            while not self.stopping.is_set():
                waiting = [
                    name
                    for name, child in self.children.items()
                    if not await self._child_live(js, child)
                ]
                if not waiting:
                    return
                # Heartbeats land in a KV bucket; re-read it in short steps (the caller of
                # `up` holds the deadline).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), 0.1)
        finally:
            await nc.close()

    @staticmethod
    async def _child_live(js: Any, child: ServiceProcess) -> bool:
        """A live, ready beat from the very process we started (not a previous run's)."""
        if not child.running or child.proc is None:
            return False
        try:
            beat = await read_beat(js, child.name, child.replica_id)
        except (nats.errors.Error, TimeoutError):
            return False  # NATS briefly away (e.g. being restarted): ask again next round
        # Ready, not only alive: a service answers requests once its brokers have started.
        return beat is not None and beat.live and beat.ready and beat.pid == child.proc.pid

    async def _shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        """Services first (they may still write), then Postgres, then NATS."""
        self.stopping.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(child.stop() for child in self.children.values()))
        if self.postgres is not None:
            await asyncio.to_thread(self.postgres.stop)
            log.info("postgres stopped")
        if self.nats is not None:
            await asyncio.to_thread(self.nats.stop)
            log.info("nats stopped")
        if self.phase != "failed":
            self._set_phase("stopped")
        else:
            self._save()

    def _child_env(self) -> dict[str, str]:
        env = dict(self.env)
        env["ROLLOUT_HOME"] = str(self.home)
        env["PYTHONUNBUFFERED"] = "1"
        env.pop(TOKEN_ENV, None)
        return env

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self._save()

    def _save(self) -> None:
        """`_write_state`, or log why it could not: supervision goes on without the record.

        On a full disk (or a state file in the way) a service that dies must still be
        restarted; the next change writes the state again.
        """
        try:
            self._write_state()
        except (OSError, RolloutError) as exc:
            log.error(
                "cannot record the stack's state", path=str(state_path(self.home)), error=str(exc)
            )

    def _write_state(self) -> None:
        """Record ports, pids and phase; the previous record supplies ports for the next `up`."""
        try:
            previous = read_state(self.home)
        except RolloutError:
            previous = {}  # unreadable: this record replaces it
        state: dict[str, Any] = {
            "phase": self.phase,
            "token": self.token,
            "error": self.error,
            "updated": time.time(),
            "supervisor": ProcessRef.of(os.getpid()).to_dict() | {"log": self._supervisor_log()},
            "services": {name: child.describe() for name, child in self.children.items()},
        }
        state["nats"] = self._server_entry("nats", self.nats, previous)
        state["postgres"] = self._server_entry("postgres", self.postgres, previous)
        if self.phase == "stopped":
            state["supervisor"] = {}
        write_json(state_path(self.home), state, private=True)

    def _server_entry(
        self,
        name: str,
        server: NatsServer | NatsCluster | PostgresServer | None,
        previous: dict[str, Any],
    ) -> dict[str, Any]:
        if name == "nats" and self.settings.external_nats:
            return {"external": True, "url": redact_url(self.settings.nats_url)}
        if name == "postgres" and self.settings.external_database:
            return {"external": True, "url": redact_url(self.settings.database_url or "")}
        if server is None or self.phase == "stopped":
            # Keep the ports (the next `up` prefers them) but no pid of a gone process.
            return without_pids(previous.get(name) or {})
        return {"external": False, **server.describe()}

    def _supervisor_log(self) -> str:
        return str(self.home / "logs" / "supervisor.log")


def replica_keys(service: str, replicas: int) -> list[str]:
    """The supervisor's names for a service's replicas: `tracker`, then `tracker-2`, ..."""
    return [service] + [f"{service}-{i}" for i in range(2, replicas + 1)]


def without_pids(entry: dict[str, Any]) -> dict[str, Any]:
    """A server's state entry without process identities (its nodes' too): ports are kept."""
    kept = {k: v for k, v in entry.items() if k not in ("pid", "create_time")}
    if isinstance(kept.get("nodes"), list):
        kept["nodes"] = [without_pids(node) for node in kept["nodes"] if isinstance(node, dict)]
    return kept


def check_nats_mode(home: Path, cluster: int) -> None:
    """Refuse to start a NATS shape whose event log is not the one this home already holds.

    A single server and each cluster node keep separate stores, and the read models in
    Postgres follow one log's positions: switching would silently start a second history.
    """
    single = home / "nats" / "jetstream"
    nodes = home / "nats" / "cluster"
    existing = sorted(p.name for p in nodes.iterdir()) if nodes.is_dir() else []
    has_single = single.is_dir() and any(single.iterdir())
    if cluster > 1 and has_single:
        raise RolloutError(
            f"{home} holds the event log of a single nats-server ({single})",
            problems=[
                "`rollout up` without --cluster goes on with it",
                "for a cluster, use a fresh ROLLOUT_HOME (the cluster keeps its own log)",
            ],
        )
    if cluster == 1 and existing:
        raise RolloutError(
            f"{home} holds the event log of a {len(existing)}-node NATS cluster ({nodes})",
            problems=[f"`rollout up --cluster {len(existing)}` goes on with it"],
        )
    if cluster > 1 and existing and len(existing) != cluster:
        raise RolloutError(
            f"{home} holds a {len(existing)}-node NATS cluster, not {cluster}",
            problems=[f"`rollout up --cluster {len(existing)}`, or a fresh ROLLOUT_HOME"],
        )


def stop_recorded(state: dict[str, Any]) -> list[str]:
    """Stop the services and servers a state file names that still run (services first)."""
    stopped = []
    for name, ref in _recorded(state):
        if not ref.alive():
            continue
        stopped.append(name)
        # Postgres: SIGINT is its "fast" shutdown; SIGTERM would wait for clients to leave.
        sig = signal.SIGINT if name == "postgres" else signal.SIGTERM
        server = name == "postgres" or name.startswith("nats")
        stop_process(ref, sig=sig, timeout=30.0 if server else 15.0)
    return stopped


def _recorded(state: dict[str, Any]) -> list[tuple[str, ProcessRef]]:
    """(name, process) for each service, then Postgres, then NATS (each node of a cluster), as
    the state names them."""
    entries = [*(state.get("services") or {}).items()]
    entries.append(("postgres", state.get("postgres")))
    nats = state.get("nats") or {}
    nodes = [node for node in nats.get("nodes") or [] if isinstance(node, dict)]
    entries += [(f"nats-{node.get('node')}", node) for node in nodes] or [("nats", nats)]
    return [(name, ref) for name, entry in entries if (ref := ProcessRef.from_dict(entry))]


def down(home: Path, timeout: float = 60.0) -> list[str]:
    """Stop what `up` started for this home: the supervisor stops it all in order.

    Whatever the state file still names afterwards (a supervisor that was killed) is stopped
    directly, services first. Returns the names of the components that were running.
    """
    state = read_state(home)
    running = [name for name, ref in _recorded(state) if ref.alive()]
    supervisor = ProcessRef.from_dict(state.get("supervisor"))
    if supervisor is not None and supervisor.alive():
        running.insert(0, "supervisor")
        stop_process(supervisor, timeout=timeout)
        state = read_state(home)
    stop_recorded(state)
    if state:
        state["phase"] = "stopped"
        state["supervisor"] = {}
        for name in ("nats", "postgres"):
            state[name] = without_pids(state.get(name) or {})
        for entry in (state.get("services") or {}).values():
            entry.pop("pid", None)
            entry.pop("create_time", None)
        write_json(state_path(home), state, private=True)
    return running
