"""Services' side of the plugin host: sandboxed worker processes, pooled per plugin version.

A host is one worker process in the bubblewrap sandbox (no network, read-only system, private
/tmp, a scrubbed environment, rlimits) that has imported one plugin version. An episode leases
a host for its whole life and gives it back at close; a warm host then serves the next episode
of the same version (every reset builds a fresh env object). Hosts are keyed by the content
hash of (entrypoint, sources), so a new version gets new hosts while old ones age out. A host
that crashes, or misses a deadline (it is then killed), fails only the episode that held it:
during a step that is the step's tool error and the episode goes on, replayed on a fresh host
(templates/plugin.py); at start, reset or state the episode ends, errored.

Per step the costs are process switches, not JSON (profiled on a loaded 2-core machine: the
client's Python ~40 µs, the worker's ~20 µs, two switches with their cold caches the rest of
~160 µs). So an async caller whose loop has nothing else ready waits briefly for the reply
with one select (quick_wait_s) instead of a trip through the loop; and with
episodes_per_host > 1 the episodes of one batch share a host, their calls of a turn going in
one message. When a plugin kills a shared host (crash, hang), its partners are replayed on
hosts of their own (reset and their recorded steps) and go on; the culprit's step then fails
again on its own host, as its own tool error. A partner whose replay gives different results
(a non-deterministic plugin) ends, saying so. The default, 1, is one host per episode.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, Field, ValidationError

from rollout.shared.envs.plugin_host import protocol
from rollout.shared.envs.plugin_host.worker import PluginError
from rollout.shared.envs.runtime import EnvironmentFailed
from rollout.shared.envs.sandbox import SandboxedProcess, SandboxLimits, start_sandboxed
from rollout.shared.errors import RolloutError

log = structlog.get_logger(__name__)

_WORKER_SOURCE = (Path(__file__).parent / "worker.py").read_text(encoding="utf-8")
_READ_CHUNK = 1 << 16
# A version whose host crashed or hung while importing is not retried before this long.
BROKEN_HOST_RETRY_S = 60.0
_STDERR_TAIL = 600


class HostFailed(EnvironmentFailed):
    """The plugin's host crashed or missed a deadline (and was killed). In a step that is the
    step's tool error (templates/plugin.py replays the episode on a fresh host); anywhere
    else (start, reset, state) the episode ends, errored."""


class HostSettings(BaseModel):
    """Limits of every plugin host (operator settings, from ROLLOUT_PLUGIN_* variables)."""

    step_timeout_s: float = Field(30.0, gt=0, le=3600, description="Per reset/step/state/close.")
    start_timeout_s: float = Field(60.0, gt=0, le=3600, description="Start and plugin import.")
    memory_mb: int = Field(1024, ge=64, description="Address space of the worker; its /tmp.")
    cpu_seconds: int = Field(600, ge=1, description="CPU over a host's life; recycled at half.")
    max_processes: int = Field(32, ge=1)
    max_file_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_disk_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1024,
        description="What a host may add to its folder over its life (killed past it); a host "
        "past half of it is recycled when its episode ends.",
    )
    max_disk_files: int = Field(10_000, ge=1, description="Files and folders it may add.")
    max_result_bytes: int = Field(1_000_000, ge=1024, description="Largest reply (JSON bytes).")
    max_episodes_per_host: int = Field(1000, ge=1)
    max_idle_per_version: int = Field(32, ge=0)
    max_versions: int = Field(8, ge=1, description="Versions whose idle hosts are kept warm.")
    idle_ttl_s: float = Field(300.0, gt=0)
    episodes_per_host: int = Field(
        1,
        ge=1,
        le=256,
        description="Episodes of one batch that share a host; their steps of a turn go in one "
        "message. When a shared host dies, its episodes are replayed on hosts of their own "
        "(one that replays differently ends). 1: every episode has a host of its own.",
    )
    quick_wait_s: float = Field(
        0.002,
        ge=0,
        le=0.1,
        description="How long an async caller waits for a reply outside the event loop when "
        "the loop has nothing else ready (0: always through the loop).",
    )

    @classmethod
    def from_env(cls) -> HostSettings:
        """Settings with ROLLOUT_PLUGIN_<FIELD> overrides; a bad value names its variable."""
        values: dict[str, str] = {}
        for name in cls.model_fields:
            raw = os.environ.get(f"ROLLOUT_PLUGIN_{name.upper()}")
            if raw is not None:
                values[name] = raw
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            var = f"ROLLOUT_PLUGIN_{str(err['loc'][0]).upper()}"
            raise RolloutError(f"{var}: {err['msg']}") from None

    def limits(self) -> SandboxLimits:
        """The sandbox's kernel limits for one host."""
        return SandboxLimits(
            cpu_seconds=self.cpu_seconds,
            memory_mb=self.memory_mb,
            max_processes=self.max_processes,
            max_file_bytes=self.max_file_bytes,
            max_disk_bytes=self.max_disk_bytes,
            max_disk_files=self.max_disk_files,
            wall_seconds=self.start_timeout_s,
        )


def host_key(entrypoint: str, sources: dict[str, str] | None) -> str:
    """The content hash a host is keyed by: one host serves one plugin version."""
    body = json.dumps({"entrypoint": entrypoint, "sources": sources or {}}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code > 128 and code - 128 in signal.valid_signals():
        return f"killed by {signal.Signals(code - 128).name}"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class PluginHost:
    """One sandboxed worker serving one plugin version, an episode at a time."""

    def __init__(
        self, key: str, entrypoint: str, sources: dict[str, str] | None, settings: HostSettings
    ) -> None:
        self.key = key
        self.entrypoint = entrypoint
        self.settings = settings
        self.dead: str | None = None
        # Whether it was killed for missing a deadline (else it crashed or broke the protocol).
        self.hung = False
        self.episodes = 0
        # Episodes of one batch sharing this host (1: the usual, one episode at a time).
        self.members = 1
        self._queue: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._early: dict[int, dict[str, Any]] = {}
        self.batches = 0  # messages that carried several episodes' calls (tests, benchmarks)
        self.cpu_s = 0.0
        self.idle_since = time.monotonic()
        self._buf = bytearray()
        self._out_closed = False
        self._eof = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._next_id = 0
        self._workdir = Path(tempfile.mkdtemp(prefix="host-", dir=_private_root()))
        self._stderr = tempfile.TemporaryFile(dir=_private_root())
        try:
            self.process: SandboxedProcess = start_sandboxed(
                [sys.executable, "-I", "-c", _WORKER_SOURCE],
                self._workdir,
                settings.limits(),
                stderr=self._stderr.fileno(),
            )
        except BaseException:
            self._cleanup()
            raise
        assert self.process.proc.stdin is not None and self.process.proc.stdout is not None
        self._in = self.process.proc.stdin.fileno()
        self._out = self.process.proc.stdout.fileno()
        for fd in (self._in, self._out):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._started = time.monotonic()
        self._load = self.send(
            "load",
            {
                "entrypoint": entrypoint,
                "sources": sources or {},
                "max_result_bytes": settings.max_result_bytes,
                # The worker stops a step itself a little before we would kill the host: the
                # step is then the model's tool error and the episode's env lives on.
                "step_timeout_s": settings.step_timeout_s - min(1.0, settings.step_timeout_s / 5),
            },
            settings.start_timeout_s,
        )
        self.loaded = False

    # ------------------------------------------------------------ lifecycle

    @property
    def alive(self) -> bool:
        """False once it failed, exited or was closed."""
        if self.dead is None and self.process.proc.poll() is not None:
            self.dead = f"plugin host exited while idle ({self._exit_info()})"
        return self.dead is None

    def _exit_info(self) -> str:
        info = _describe_exit(self.process.proc.poll())
        watch = self.process.disk_watch
        if self.process.killed_reason == "disk_limit" and watch is not None:
            info = f"killed: {watch.over or 'over its disk budget'} (disk_limit)"
        tail = self._stderr_tail()
        return f"{info}; its stderr ends: {tail!r}" if tail else info

    def _stderr_tail(self) -> str:
        try:
            size = os.fstat(self._stderr.fileno()).st_size
            self._stderr.seek(max(0, size - _STDERR_TAIL))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def fail(self, reason: str, *, hung: bool = False) -> HostFailed:
        """Kill the host and return the error naming why (raise it); `hung`: a missed deadline."""
        if self.dead is None:
            if self.members > 1:
                reason += f" (a host shared by {self.members} episodes of a batch)"
            self.dead = reason
            self.hung = hung
            log.warning("plugin_host.failed", entrypoint=self.entrypoint, reason=reason)
        self.close()
        return HostFailed(self.dead)

    def close(self) -> None:
        """Kill the worker and remove its files (idempotent)."""
        if self.dead is None:
            self.dead = "plugin host closed"
        self.unwatch()
        self.process.kill()
        self._out_closed = True
        for stream in (self.process.proc.stdin, self.process.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self._cleanup()

    def _cleanup(self) -> None:
        with contextlib.suppress(OSError):
            self._stderr.close()
        shutil.rmtree(self._workdir, ignore_errors=True)

    # ------------------------------------------------------------ wire

    def send(self, op: str, payload: dict[str, Any], timeout: float) -> int:
        """Write one request (the worker may still be busy: replies come in order)."""
        if self.dead is not None:  # (a crash since is seen on the pipe: no waitpid per step)
            raise HostFailed(self.dead)
        self._next_id += 1
        view = memoryview(protocol.encode(self._next_id, op, payload))
        deadline = time.monotonic() + timeout
        while view:
            try:
                view = view[os.write(self._in, view) :]
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.fail(self._timeout_reason(op, timeout), hung=True) from None
                select.select([], [self._in], [], left)
            except (BrokenPipeError, OSError):
                raise self.fail(self._crash_reason(op)) from None
        return self._next_id

    def _timeout_reason(self, op: str, timeout: float) -> str:
        what = "importing it" if op == "load" else f"{op}"
        return (
            f"plugin {self.entrypoint!r} did not finish {what} within {timeout:g}s "
            "(its host was killed)"
        )

    def _crash_reason(self, op: str) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.proc.wait(1)
        what = "while importing it" if op == "load" else f"during {op}"
        return f"plugin host of {self.entrypoint!r} died {what} ({self._exit_info()})"

    def _pop(self, rid: int, op: str) -> dict[str, Any] | None:
        early = self._early.pop(rid, None) if self._early else None
        if early is not None:
            return early
        while True:
            end = self._buf.find(b"\n")
            if end < 0:
                limit = self.settings.max_result_bytes * max(1, self.members)
                if len(self._buf) > limit + protocol.LINE_SLACK:
                    raise self.fail(
                        f"plugin host of {self.entrypoint!r} sent a reply over "
                        f"{limit} bytes during {op} (killed)"
                    )
                return None
            line = bytes(self._buf[:end])
            del self._buf[: end + 1]
            try:
                reply = protocol.decode(line)
            except ValueError:
                raise self.fail(
                    f"plugin host of {self.entrypoint!r} sent a malformed reply during {op}"
                ) from None
            if reply["id"] == rid:
                return reply
            # Another caller's reply (a blocking call read past a shared host's batch): kept
            # for it, and its waiter woken.
            self._early[reply["id"]] = reply
            while len(self._early) > 64:
                del self._early[next(iter(self._early))]
            self._wake_waiter()

    def _read_available(self, op: str) -> None:
        if self._eof:
            raise self.fail(self._crash_reason(op))
        while True:
            try:
                chunk = os.read(self._out, _READ_CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                raise self.fail(self._crash_reason(op))
            self._buf += chunk
            if len(chunk) < _READ_CHUNK:
                return  # drained: no second read just to hear EAGAIN (an exception)

    def receive(self, rid: int, op: str, timeout: float) -> dict[str, Any]:
        """Block until reply rid (HostFailed on a crash or after timeout, the host killed)."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self._pop(rid, op)
            if reply is not None:
                return reply
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.fail(self._timeout_reason(op, timeout), hung=True)
            ready, _, _ = select.select([self._out], [], [], left)
            if ready:
                self._read_available(op)

    async def areceive(self, rid: int, op: str, limit_s: float) -> dict[str, Any]:
        """receive() for async callers: the event loop waits on the pipe, nothing blocks."""
        reply = self._pop(rid, op)
        if reply is not None:
            return reply
        loop = asyncio.get_running_loop()
        self._watch(loop)
        deadline = loop.time() + limit_s
        while True:
            # No wait_for (a task per step): one future, woken by the reader or the deadline.
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiter = waiter
            timer = loop.call_at(deadline, _set_once, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if self._eof:
                raise self.fail(self._crash_reason(op))
            reply = self._pop(rid, op)
            if reply is not None:
                return reply
            if loop.time() >= deadline:
                raise self.fail(self._timeout_reason(op, limit_s), hung=True)

    def _wake_waiter(self) -> None:
        waiter, loop = self._waiter, self._loop
        if waiter is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(_set_once, waiter)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        # The reader stays registered while the host is leased in this loop: no epoll_ctl
        # pair per step. A host moved to another loop (asyncio.run per call) re-registers.
        if self._loop is loop:
            return
        self.unwatch()
        loop.add_reader(self._out, self._on_readable)
        self._loop = loop

    def unwatch(self) -> None:
        """Stop watching the pipe from an event loop (on release and close)."""
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed() and not self._out_closed:
            loop.remove_reader(self._out)

    def _on_readable(self) -> None:
        while True:
            try:
                chunk = os.read(self._out, _READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self._eof = True
                self.unwatch()
                break
            self._buf += chunk
            if len(chunk) < _READ_CHUNK:
                break  # drained (a short read): no second read just to hear EAGAIN
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _timeout_for(self, op: str) -> float:
        return self.settings.start_timeout_s if op == "load" else self.settings.step_timeout_s

    def ensure_loaded(self) -> None:
        """Wait for the import (PluginError when the plugin does not import)."""
        if not self.loaded:
            reply = self.receive(self._load, "load", self.settings.start_timeout_s)
            self._check(reply)
            self.loaded = True

    def _check(self, reply: dict[str, Any]) -> dict[str, Any]:
        if reply.get("ok"):
            result = reply.get("result")
            return result if isinstance(result, dict) else {}
        message = str(reply.get("error"))
        if reply.get("kind") == "config":
            raise PluginError(message)
        raise ReplyError(str(reply.get("kind")), message, reply.get("type"))

    def call(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        """One blocking round trip (after the import)."""
        self.ensure_loaded()
        timeout = self._timeout_for(op)
        return self._check(self.receive(self.send(op, payload, timeout), op, timeout))

    async def acall(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        """One round trip that does not block the event loop."""
        self.ensure_loaded()
        timeout = self._timeout_for(op)
        return self._check(await self._reply(self.send(op, payload, timeout), op, timeout))

    async def _reply(self, rid: int, op: str, limit_s: float) -> dict[str, Any]:
        """Reply rid: a quick wait outside the loop when it is idle, else through the loop."""
        quick = self.settings.quick_wait_s
        if quick > 0 and _nothing_else_ready(asyncio.get_running_loop()):
            # A fast step answers in well under a millisecond: waiting for it here costs one
            # blocking select, where a trip through the loop costs a future, a reader callback,
            # two epoll calls and a task wake-up (profiled: about a third of a step's CPU).
            # Nothing else is ready, so nobody waits on the loop meanwhile (bounded anyway).
            reply = self._receive_within(rid, op, min(quick, limit_s))
            if reply is not None:
                return reply
        return await self.areceive(rid, op, limit_s)

    async def aqueued(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        """acall, except that on a shared host the calls of one loop turn go in one message."""
        if self.members <= 1:
            return await self.acall(op, payload)
        self.ensure_loaded()
        if self.dead is not None:
            raise HostFailed(self.dead)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._queue.append(({"op": op, **payload}, future))
        if self._runner is None:
            # Runs after the callbacks already ready: the other episodes' steps of this turn
            # join the queue first.
            self._runner = loop.create_task(self._run_queue())
        return self._check(await future)

    async def _run_queue(self) -> None:
        try:
            while self._queue:
                calls, self._queue = self._queue, []
                # One batch at a time (replies come in order); later steps wait for the next.
                # One step timeout for the turn's calls together: a hang is found as soon as
                # on a host of its own, and a batch that was only slow is not lost (its
                # episodes are replayed each on a host of its own, where each has its own).
                timeout = self.settings.step_timeout_s
                ops = ", ".join(sorted({call["op"] for call, _ in calls}))
                try:
                    if len(calls) == 1:
                        call = dict(calls[0][0])
                        op = call.pop("op")
                        replies = [await self._reply(self.send(op, call, timeout), op, timeout)]
                    else:
                        batch = {"calls": [call for call, _ in calls]}
                        self.batches += 1
                        reply = await self._reply(self.send("batch", batch, timeout), ops,
                                                  timeout)  # fmt: skip
                        replies = self._check(reply).get("replies") or []
                        if len(replies) != len(calls):
                            raise self.fail(
                                f"plugin host of {self.entrypoint!r} answered {len(replies)} "
                                f"of {len(calls)} steps (killed)"
                            )
                except (HostFailed, PluginError, ReplyError) as exc:
                    for _, future in calls:
                        if not future.done():
                            future.set_exception(exc)
                    if isinstance(exc, HostFailed):
                        self._fail_queue(exc)
                        return
                    continue
                for (_, future), sub in zip(calls, replies, strict=True):
                    if not future.done():
                        future.set_result(sub if isinstance(sub, dict) else {"ok": False})
        finally:
            self._runner = None

    def _fail_queue(self, exc: HostFailed) -> None:
        calls, self._queue = self._queue, []
        for _, future in calls:
            if not future.done():
                future.set_exception(exc)

    def _receive_within(self, rid: int, op: str, budget: float) -> dict[str, Any] | None:
        """Reply rid if it comes within budget, else None (the host is fine; ask again)."""
        reply = self._pop(rid, op)
        if reply is not None:
            return reply
        deadline = time.monotonic() + budget
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._out], [], [], left)
            if not ready:
                return None
            self._read_available(op)
            reply = self._pop(rid, op)
            if reply is not None:
                return reply


class ReplyError(Exception):
    """A reply with ok=false of kind episode or tool (the host itself is fine)."""

    def __init__(self, kind: str, message: str, error_type: object) -> None:
        super().__init__(message)
        self.kind = kind
        self.error_type = error_type if isinstance(error_type, str) else None


def _nothing_else_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """True when no other callback waits to run (asyncio's own loop; others: never known)."""
    # BaseEventLoop keeps its runnable callbacks in `_ready`; a loop without it (uvloop) always
    # takes the loop path, which is correct, only slower.
    ready = getattr(loop, "_ready", None)
    return ready is not None and not ready


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# ---------------------------------------------------------------- the pool


class HostPool:
    """Warm hosts per plugin version; an episode leases one and gives it back at close."""

    def __init__(self, settings: HostSettings | None = None) -> None:
        self.settings = settings or HostSettings.from_env()
        self._idle: OrderedDict[str, list[PluginHost]] = OrderedDict()
        self._leased: set[PluginHost] = set()
        # Hosts of runtimes collected without close(): appended from a GC finalizer (a deque
        # append takes no lock), killed at the pool's next lease, release or close.
        self._abandoned: deque[PluginHost] = deque()
        self._broken: dict[str, tuple[str, str, float]] = {}
        self._lock = threading.Lock()
        self.started = 0  # hosts ever started (tests and benchmarks read it)

    @property
    def leased(self) -> int:
        """Hosts leased to episodes and not given back yet."""
        with self._lock:
            return len(self._leased)

    def abandon(self, host: PluginHost) -> None:
        """A runtime was collected without close(): its host is killed soon (GC-safe)."""
        self._abandoned.append(host)

    def _reap(self) -> None:
        while self._abandoned:
            try:
                host = self._abandoned.popleft()
            except IndexError:
                return
            with self._lock:
                if host.members > 1:  # its batch's other episodes still use it
                    host.members -= 1
                    continue
                self._leased.discard(host)
            log.info("plugin_host.abandoned", entrypoint=host.entrypoint)
            host.close()

    def lease(
        self, entrypoint: str, sources: dict[str, str] | None, *, spare: bool = False
    ) -> PluginHost:
        """A host of this plugin version that has imported it (PluginError if it does not)."""
        self._reap()
        key = host_key(entrypoint, sources)
        host = None
        with self._lock:
            broken = self._broken.get(key)
            if broken is not None and broken[2] > time.monotonic():
                raise (PluginError if broken[0] == "config" else HostFailed)(broken[1])
            idle = self._idle.get(key, [])
            while idle and host is None:
                candidate = idle.pop()
                if candidate.alive:
                    host = candidate
                else:
                    candidate.close()
            if key in self._idle:
                self._idle.move_to_end(key)
            want_spare = spare and not idle and self.settings.max_idle_per_version > 0
        if host is None:
            host = self._start(key, entrypoint, sources)
        if want_spare:
            # Boots while this episode waits on its own host: a batch's starts overlap.
            self._put(self._start(key, entrypoint, sources))
        try:
            host.ensure_loaded()
        except PluginError as exc:
            # The same sources never import: later episodes fail at once, not one by one.
            self._remember(key, "config", str(exc), float("inf"))
            host.close()
            raise
        except HostFailed as exc:  # it crashed or hung importing: may be transient, retry later
            self._remember(key, "host", str(exc), time.monotonic() + BROKEN_HOST_RETRY_S)
            raise
        with self._lock:
            self._leased.add(host)
        return host

    def _remember(self, key: str, kind: str, message: str, until: float) -> None:
        with self._lock:
            self._broken[key] = (kind, message, until)
            for spare in self._idle.pop(key, []):
                spare.close()

    def _start(self, key: str, entrypoint: str, sources: dict[str, str] | None) -> PluginHost:
        host = PluginHost(key, entrypoint, sources, self.settings)
        with self._lock:
            self.started += 1
        return host

    def _put(self, host: PluginHost) -> None:
        evicted: list[PluginHost] = []
        with self._lock:
            idle = self._idle.setdefault(host.key, [])
            self._idle.move_to_end(host.key)
            if len(idle) < self.settings.max_idle_per_version:
                host.idle_since = time.monotonic()
                idle.append(host)
            else:
                evicted.append(host)
            while len(self._idle) > self.settings.max_versions:
                _, old = self._idle.popitem(last=False)
                evicted.extend(old)
            now = time.monotonic()
            for hosts in self._idle.values():
                stale = [h for h in hosts if now - h.idle_since > self.settings.idle_ttl_s]
                for h in stale:
                    hosts.remove(h)
                evicted.extend(stale)
        for h in evicted:
            h.close()

    def lease_shared(
        self, entrypoint: str, sources: dict[str, str] | None, members: int
    ) -> PluginHost:
        """A host that `members` episodes of one batch share (each releases it once)."""
        host = self.lease(entrypoint, sources, spare=True)
        host.members = max(1, members)
        return host

    def release(self, host: PluginHost) -> None:
        """Take a host back after an episode (or its failure): kept warm when healthy."""
        self._reap()
        with self._lock:
            if host.members > 1:  # other episodes of its batch still use it
                host.members -= 1
                host.episodes += 1
                return
            self._leased.discard(host)
        host.unwatch()
        host.episodes += 1
        disk = host.process.disk_watch
        if disk is not None:
            disk.refresh()
        worn = (
            host.episodes >= self.settings.max_episodes_per_host
            or host.cpu_s > self.settings.cpu_seconds / 2
            # Its folder outlives episodes: recycled (the folder removed) well before an
            # honest plugin that writes a little per episode reaches the kill.
            or (disk is not None and disk.used_bytes > self.settings.max_disk_bytes / 2)
            or (disk is not None and disk.used_files > self.settings.max_disk_files / 2)
        )
        if not host.alive or worn:
            host.close()
            return
        self._put(host)

    def idle_count(self, entrypoint: str, sources: dict[str, str] | None) -> int:
        """Idle hosts of one version (tests)."""
        with self._lock:
            return len(self._idle.get(host_key(entrypoint, sources), []))

    def close(self) -> None:
        """Close every host: idle, still leased and abandoned ones."""
        self._reap()
        with self._lock:
            hosts = [h for hs in self._idle.values() for h in hs] + list(self._leased)
            self._idle.clear()
            self._leased.clear()
            self._broken.clear()
        for h in hosts:
            h.close()


_pool: HostPool | None = None
_pool_lock = threading.Lock()
_root: Path | None = None
_root_lock = threading.Lock()


_starter: concurrent.futures.ThreadPoolExecutor | None = None


def starter() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that start hosts and replay episodes off the event loop (this process's).

    Long-lived on purpose: a host's sandbox gets SIGKILL when the *thread* that spawned it
    ends (PR_SET_PDEATHSIG), so hosts are never spawned from a short-lived thread such as an
    event loop's default executor, which ends with its loop.
    """
    global _starter
    with _pool_lock:
        if _starter is None:
            _starter = concurrent.futures.ThreadPoolExecutor(
                max_workers=8, thread_name_prefix="plugin-host-start"
            )
        return _starter


def default_pool() -> HostPool:
    """This process's pool (settings read from the environment on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = HostPool()
            atexit.register(_pool.close)
        return _pool


_ROOT_PREFIX = "rollout-plugin-hosts-"
_ROOT_NAME = re.compile(rf"^{_ROOT_PREFIX}(\d+)-")


def _private_root() -> Path:
    """A 0700 folder of this process only (mkdtemp: unpredictable name, created atomically)."""
    global _root
    with _root_lock:
        if _root is None or not _root.is_dir():
            remove_stale_roots()
            _root = Path(tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{os.getpid()}-"))
            atexit.register(shutil.rmtree, _root, True)
        return _root


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_stale_roots(folder: str | None = None) -> list[Path]:
    """Remove host folders left by processes of this user that died without their atexit
    (SIGKILL, OOM): real folders of ours whose pid is gone. Returns what was removed."""
    base = Path(folder or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = _ROOT_NAME.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        # Only our own real folders (never a symlink someone planted in a shared /tmp).
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        if _pid_alive(int(match.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    if removed:
        log.info("plugin_host.stale_folders_removed", count=len(removed))
    return removed
