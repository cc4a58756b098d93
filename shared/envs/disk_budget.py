"""A disk budget for what sandboxed code writes to the writable host folders bound into it.

The kernel caps each file (RLIMIT_FSIZE) but nothing caps their total or their number, and
quotas are rarely available (unprivileged, or on the host's filesystem). So one thread per
process measures every watched sandbox's writable folders every `INTERVAL_S` (an ``os.scandir``
walk summing each entry's allocated size, stopped at the entry cap) and calls the watch's
`on_over` once its growth since the start passes the byte or entry budget; the caller kills the
sandbox then.

Overshoot: the code keeps writing until the kill lands, about one interval plus one round of
scans (each capped at `max_files` entries) plus the kill; at a few GB/s of page-cache writes
that is a few hundred MB at most, and no single file can pass the budget (RLIMIT_FSIZE is
lowered to it), nor a single round more than `max_files` entries plus what is created during
it. Measured on a loaded 2-core machine (ext4, root and unprivileged callers): 15-55 MiB past
a 256 or 512 MiB budget with one writer or nine in parallel.

A folder the sandbox made unreadable (unprivileged callers cannot look inside; root can) is
forgiven for `UNREADABLE_GRACE_S` (a test may chmod a folder briefly), then counts as over the
budget: what is written into it meanwhile, through files opened before, is the one overshoot
bounded by time (the grace) rather than by the interval.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

INTERVAL_S = 0.05
UNREADABLE_GRACE_S = 1.0
_BASE_CAP = 1_000_000


@dataclass
class Usage:
    """What a walk of the folders found: allocated bytes, entries, unreadable folders."""

    bytes: int = 0
    entries: int = 0
    unreadable: list[str] = field(default_factory=list)


def measure(roots: Sequence[Path], max_entries: int) -> Usage:
    """Allocated bytes and entries under roots (the roots themselves not counted as entries).

    Stops once more than max_entries were seen, so one walk costs at most that many lstat calls.
    A file counts the larger of its length and its allocated blocks: a sparse file is no
    smaller than it claims (its length is capped by RLIMIT_FSIZE anyway), and a filesystem
    that allocates lazily is not undercounted.
    """
    usage = Usage()
    todo = [str(r) for r in roots]
    while todo:
        folder = todo.pop()
        try:
            it = os.scandir(folder)
        except FileNotFoundError:
            continue
        except OSError:
            usage.unreadable.append(folder)
            continue
        with it:
            for entry in it:
                usage.entries += 1
                if usage.entries > max_entries:
                    return usage
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                size = st.st_blocks * 512
                if stat.S_ISREG(st.st_mode):
                    size = max(size, st.st_size)
                elif stat.S_ISDIR(st.st_mode):
                    todo.append(entry.path)
                usage.bytes += size
    return usage


class Watch:
    """One sandbox's folders and budget; `stop()` ends the watching (idempotent)."""

    def __init__(
        self,
        roots: Sequence[Path],
        max_bytes: int,
        max_files: int,
        on_over: Callable[[str], None],
        fds: Sequence[int] = (),
    ) -> None:
        self.roots = list(roots)
        self.fds = list(fds)
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.on_over = on_over
        # What the host put there first (a project's files) is not the sandbox's writing; walked
        # in full once, so a large project does not look like growth.
        self.base = self._measure(_BASE_CAP)
        self.last = self.base
        self.over: str | None = None
        self._unreadable_since: float | None = None

    def _measure(self, max_entries: int) -> Usage:
        usage = measure(self.roots, max_entries)
        for fd in self.fds:  # host files the sandbox writes through an fd (a host's stderr)
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                usage.bytes += max(st.st_size, st.st_blocks * 512)
        return usage

    @property
    def used_bytes(self) -> int:
        """Growth in bytes since the watch began, at the last measurement."""
        return max(0, self.last.bytes - self.base.bytes)

    @property
    def used_files(self) -> int:
        """Files and folders added since the watch began, at the last measurement."""
        return max(0, self.last.entries - self.base.entries)

    def refresh(self) -> None:
        """Measure now (the owner's decision should not wait for the next round)."""
        self.last = self._measure(self.base.entries + self.max_files)

    def check(self) -> str | None:
        """Measure once; why it is over its budget, or None."""
        # The cap stops the walk just past the budget: the base's entries are allowed on top.
        self.last = usage = self._measure(self.base.entries + self.max_files)
        grown = usage.bytes - self.base.bytes
        if grown > self.max_bytes:
            return (
                f"it wrote more than {self.max_bytes} bytes to its writable folders "
                f"(disk budget; {grown} seen)"
            )
        if usage.entries - self.base.entries > self.max_files:
            return f"it created more than {self.max_files} files and folders (disk budget)"
        if usage.unreadable and not self.base.unreadable:
            now = time.monotonic()
            if self._unreadable_since is None:
                self._unreadable_since = now
            elif now - self._unreadable_since > UNREADABLE_GRACE_S:
                return (
                    f"it made a folder unreadable for over {UNREADABLE_GRACE_S:g}s, so its "
                    f"disk use cannot be measured ({usage.unreadable[0]})"
                )
        else:
            self._unreadable_since = None
        return None

    def stop(self) -> None:
        """Stop watching these folders."""
        _watcher.remove(self)


class _Watcher:
    """The one thread that measures every watch of this process."""

    def __init__(self) -> None:
        self._watches: set[Watch] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def add(self, watch: Watch) -> None:
        with self._lock:
            self._watches.add(watch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="sandbox-disk-watch", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def remove(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._watches:
                    self._wake.wait()
                watches = list(self._watches)
            for watch in watches:
                if watch.over is not None:
                    continue
                try:
                    reason = watch.check()
                except Exception:  # never let one folder end the watching of all
                    log.exception("sandbox.disk_watch_failed", roots=[str(r) for r in watch.roots])
                    continue
                if reason is not None:
                    watch.over = reason
                    log.warning("sandbox.disk_limit", reason=reason)
                    with contextlib.suppress(Exception):
                        watch.on_over(reason)
            time.sleep(INTERVAL_S)


_watcher = _Watcher()


def watch(
    roots: Sequence[Path],
    max_bytes: int,
    max_files: int,
    on_over: Callable[[str], None],
    fds: Sequence[int] = (),
) -> Watch:
    """Start measuring roots (and the files open as fds); on_over(reason) is called once (from
    the watcher's thread)."""
    w = Watch(roots, max_bytes, max_files, on_over, fds)
    _watcher.add(w)
    return w
