"""Processes the hidden tests start run confined: they cannot read the tests, harness or report.

A test may run the model's script (`subprocess.run([sys.executable, "calc.py"])`, a plain CLI
test). That process shares the tests' sandbox; unconfined, it could find the hidden tests (the
mount table names their directory) and hand them to the model's process through the work dir.
A child forked from the tests (multiprocessing) is confined the same way, and multiprocessing's
fresh interpreters (spawn, forkserver) are refused: one would import the test module again and,
with the work dir on sys.path, the model's files with it, outside the model's sandbox.
Loaded by the isolated hidden-test bootstrap with the tests' side (`_xproc_tests`); never
imports `rollout`.
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
from typing import Any

# Landlock (Linux 5.13+): the same syscall numbers on every architecture.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_FS_READ = 1 | 4 | 8  # execute, read a file, read a directory
_FS_FILE = 1 | 2 | 4 | (1 << 14) | (1 << 15)  # the rights a rule on a single file may carry
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: no Landlock, or disabled)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, 0, 1)  # 1: the ABI version
    except (OSError, AttributeError):
        return 0
    return max(int(abi), 0)


def landlock_ruleset(readable: list[str], writable: list[str], private: list[str]) -> int:
    """A Landlock ruleset (its fd) that reads `readable`, reads and writes `writable` and
    reaches nothing else; a path holding one of `private` is left out. OSError where the
    kernel has no Landlock."""
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, 0, 1)  # 1: the ABI version
    if abi < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not available on this kernel")
    handled = (1 << 13) - 1
    for bit, since in ((13, 2), (14, 3), (15, 5)):  # refer, truncate, ioctl on devices
        handled |= (1 << bit) if abi >= since else 0
    scoped = 3 if abi >= 6 else 0  # no signals and no abstract sockets out of the domain
    attr = ctypes.create_string_buffer(struct.pack("=QQQ", handled, 0, scoped), 24)
    ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, attr, 24, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "cannot create a Landlock ruleset")
    hidden = [os.path.realpath(p) for p in private]
    rules = [(p, _FS_READ) for p in readable] + [(p, handled) for p in writable]
    try:
        for path, access in rules:
            real = os.path.realpath(path)
            if not os.path.exists(real) or any(_inside(h, real) for h in hidden):
                continue
            if not os.path.isdir(real):
                access &= _FS_FILE
            target = os.open(real, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, target), 12)
                if libc.syscall(_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, rule, 0):
                    raise OSError(ctypes.get_errno(), f"cannot add a Landlock rule for {real}")
            finally:
                os.close(target)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def confine_children(workdir: str, scratch: str, private: list[str]) -> None:
    """Start every process the tests start inside a Landlock domain of its own.

    A test may run the model's script (`subprocess.run([sys.executable, "calc.py"])`): that
    process shares this sandbox, and unconfined it could read the hidden tests (the mount table
    names their directory) and hand them to the model's process through the work dir. Confined,
    it reads the system and the Python installation, reads and writes the work dir and
    tmp_path, and reaches neither the tests, the harness nor the report, nor (Landlock 6+)
    signals this process. Where the kernel has no Landlock, no process is started at all.
    """
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    prefixes.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    readable = [*_SYSTEM, *sorted(prefixes)]
    try:
        ruleset: int | None = landlock_ruleset(readable, ["/dev", workdir, scratch], private)
        why = ""
    except OSError as exc:
        ruleset, why = None, str(exc)
    libc = ctypes.CDLL(None, use_errno=True)

    def enter() -> None:
        # In the child, before it runs anything (after fork, or just before exec).
        if ruleset is None:
            raise PermissionError(
                f"the tests cannot start a process here: it would see the hidden tests ({why})"
            )
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0):
            raise OSError(ctypes.get_errno(), "cannot enter the Landlock domain")

    def chained(user: Any) -> Any:
        def preexec() -> None:
            if user is not None:
                user()
            enter()

        return preexec

    popen_init = subprocess.Popen.__init__

    def confined_init(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        if ruleset is None:
            enter()  # raises, in this process, saying why
        rest_list = list(rest)
        if len(rest_list) > 5:  # preexec_fn given by position (Popen's 7th parameter)
            rest_list[5] = chained(rest_list[5])
        else:
            kwargs["preexec_fn"] = chained(kwargs.get("preexec_fn"))
        popen_init(self, args, *rest_list, **kwargs)

    subprocess.Popen.__init__ = confined_init  # type: ignore[method-assign]

    def system(command: Any) -> int:
        code = subprocess.call(command, shell=True)  # noqa: S602 - os.system's own contract
        return code << 8 if code >= 0 else -code  # a wait status, as os.system returns

    os.system = system

    def confining(exec_: Any) -> Any:
        def confined_exec(*args: Any) -> Any:
            enter()
            return exec_(*args)

        return confined_exec

    # os.exec*, os.spawn* and pty.spawn all end in these two.
    os.execv, os.execve = confining(os.execv), confining(os.execve)

    def no_spawn(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError("the tests cannot posix_spawn here: use subprocess")

    os.posix_spawn = os.posix_spawnp = no_spawn
    confine_forks(enter, ruleset is not None, why)
    refuse_fresh_interpreters()


def confine_forks(enter: Any, available: bool, why: str) -> None:
    """Every process forked from the tests' (multiprocessing's fork, os.fork, pty.fork) enters
    the Landlock domain before it runs anything of the tests' again.

    A forked child runs only the tests' code, but unconfined it would reach the hidden tests,
    the harness and the report: the same rules as for a process they start, then.
    """

    def in_child() -> None:
        try:
            enter()
        except BaseException:  # noqa: BLE001 - never go on unconfined
            os._exit(126)

    os.register_at_fork(after_in_child=in_child)
    if available:
        return

    def no_fork(*args: Any) -> Any:
        raise PermissionError(
            f"the tests cannot fork here: the child would see the hidden tests ({why})"
        )

    os.fork = os.forkpty = no_fork


def refuse_fresh_interpreters() -> None:
    """multiprocessing's spawn and forkserver start methods (and its resource tracker) are
    refused, and fork made the default: all three start a fresh interpreter, which no barrier of
    the tests' process guards.

    Such a child imports the test module again, with the work dir on sys.path when a test put
    it there, so a file of the model's (its module, or one named as a standard module) would run
    in it, outside the model's sandbox; and the tests' process unpickles what it sends back.
    """
    import multiprocessing
    import multiprocessing.util

    def no_fresh_interpreter(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(
            "the tests cannot start a fresh Python here (multiprocessing's spawn or forkserver "
            "start method, or its resource tracker): it would load the model's files outside "
            "its sandbox; use the fork start method (multiprocessing.get_context('fork'))"
        )

    multiprocessing.util.spawnv_passfds = no_fresh_interpreter  # type: ignore[assignment]
    multiprocessing.set_start_method("fork", force=True)
