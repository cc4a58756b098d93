"""Child-process plumbing shared by the launchers: ports, log waits, identity-checked stops."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from rollout.shared.errors import RolloutError

LOOPBACK = "127.0.0.1"
# How far two reads of one process's start time may differ (see ProcessRef.alive).
CREATE_TIME_SLACK_S = 1.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessRef:
    """A pid plus its start time, so a recycled pid is never mistaken for our process."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcessRef:
        """Capture the identity of a running pid."""
        return cls(pid=pid, create_time=psutil.Process(pid).create_time())

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ProcessRef | None:
        """Read a ref back from the state file; None when absent or malformed."""
        if not data or "pid" not in data or "create_time" not in data:
            return None
        return cls(pid=int(data["pid"]), create_time=float(data["create_time"]))

    def to_dict(self) -> dict[str, Any]:
        """The form stored in the state file."""
        return asdict(self)

    def alive(self) -> bool:
        """True while this exact process runs (zombies count as gone)."""
        try:
            proc = psutil.Process(self.pid)
            return (
                # Linux derives a start time from /proc/stat's btime (wall clock minus uptime),
                # which moves when the clock is stepped: two reads may differ by a second. A
                # reused pid started within that second of the original is not a real risk.
                abs(proc.create_time() - self.create_time) < CREATE_TIME_SLACK_S
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True when nothing listens on host:port right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """A port the kernel says is free now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def choose_port(requested: int | None, preferred: list[int]) -> tuple[int, bool]:
    """Pick a port: the requested one (fixed), else the first free preferred, else any free.

    Returns the port and whether it was chosen automatically (so a bind race may retry).
    """
    if requested:
        return requested, False
    if requested is None:
        for port in preferred:
            if port and port_is_free(port):
                return port, True
    return free_port(), True


def die_with_parent() -> None:
    """preexec_fn: have the kernel SIGKILL this child when the parent dies (test fixtures)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def wait_for_log(
    log_path: Path,
    offset: int,
    ready: Callable[[str], bool],
    process: subprocess.Popen[bytes] | None,
    *,
    what: str,
    timeout: float,
) -> None:
    """Wait until the log, read from `offset`, satisfies `ready`; fail fast if the process dies."""
    deadline = time.monotonic() + timeout
    while True:
        text = read_from(log_path, offset)
        if ready(text):
            return
        if process is not None and process.poll() is not None:
            raise ServerStartError(what, f"exited with code {process.returncode}", text)
        if time.monotonic() > deadline:
            raise ServerStartError(what, f"not ready after {timeout:.0f}s", text)
        # The log is a plain file (no inotify here): re-read it in short steps until the deadline.
        time.sleep(0.02)


def read_from(path: Path, offset: int) -> str:
    """The text of a file from a byte offset on ('' when missing)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def file_size(path: Path) -> int:
    """Current size of a file, 0 when missing."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def tail(text: str, lines: int = 15) -> str:
    """The last lines of a log, for error messages."""
    return "\n".join(text.strip().splitlines()[-lines:])


class ServerStartError(RolloutError):
    """A server process did not come up; carries the end of its log."""

    def __init__(self, what: str, reason: str, log: str, problems: list[str] | None = None) -> None:
        super().__init__(
            f"{what} did not start: {reason}", problems=problems or [tail(log) or "(empty log)"]
        )
        self.what = what
        self.log = log


# How nats-server and Postgres log a listen port another process holds.
_PORT_IN_USE = (
    re.compile(r"^.*127\.0\.0\.1:(\d+).*address already in use.*$", re.MULTILINE),
    re.compile(r"^.*another postmaster already running on port (\d+).*$", re.MULTILINE),
)


def port_taken(exc: ServerStartError, settings: dict[int, str]) -> ServerStartError:
    """`exc`, or one that names the port its log says another process holds and the setting
    (`settings`: port -> variable) that asked for it, with that log line alone."""
    for pattern in _PORT_IN_USE:
        if found := pattern.search(exc.log):
            port = int(found.group(1))
            fix = f"stop the process that listens on {port}"
            if setting := settings.get(port):
                fix += f", or set {setting} to another port (0: any free one)"
            return ServerStartError(
                exc.what,
                f"port {port} is in use by another process",
                exc.log,
                problems=[fix, found.group(0).strip()],
            )
    return exc


def stop_process(
    ref: ProcessRef | None,
    *,
    sig: int = signal.SIGTERM,
    timeout: float = 15.0,
    popen: subprocess.Popen[Any] | None = None,
) -> bool:
    """Send `sig`, wait up to `timeout`, then SIGKILL. Returns True if it had to kill."""
    if ref is None or not ref.alive():
        _reap(popen)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(ref.pid, sig)
    if _wait_gone(ref, popen, timeout):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(ref.pid, signal.SIGKILL)
    _wait_gone(ref, popen, 5.0)
    return True


def _wait_gone(ref: ProcessRef, popen: subprocess.Popen[Any] | None, timeout: float) -> bool:
    """Wait for the process to exit; our own children are reaped so they do not linger."""
    if popen is not None:
        try:
            popen.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    # Not our child: we cannot wait(2) on it, and an init that does not reap would leave a
    # zombie, so poll its identity (zombies count as gone) until the deadline.
    deadline = time.monotonic() + timeout
    while ref.alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _reap(popen: subprocess.Popen[Any] | None) -> None:
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(0.1)


def env_port(name: str) -> int | None:
    """A fixed port from the environment, validated."""
    raw = os.environ.get(name)
    if not raw:
        return None
    if not raw.isdigit() or not 0 <= int(raw) < 65536:
        raise RolloutError(f"{name}={raw!r} is not a port number (0-65535)")
    return int(raw)
