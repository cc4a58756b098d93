"""Helpers shared by CLI verbs: settings, connections, JSON output."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from rollout.errors import RolloutError
from rollout.shared.envs.judged import NOTHING_SCORED
from rollout.shared.settings import Settings, load_settings
from rollout.shared.stale import stale_note


def settings_or_error() -> Settings:
    """The stack's own settings (service credentials, database): for operator verbs."""
    return load_settings()


def client_settings_or_error() -> Settings:
    """What a user's verb connects with: API key / login / the local stack's key."""
    from rollout.shared.auth.credentials import client_settings

    return client_settings()


def require_database(settings: Settings) -> str:
    """The database URL, or a clear error saying how to get one."""
    if not settings.database_url:
        raise RolloutError(
            "no database configured",
            problems=["start the embedded stack with `rollout up`, or set ROLLOUT_DATABASE_URL"],
        )
    return settings.database_url


def env_ref(value: str, version: int | None, what: str) -> tuple[str, int | None]:
    """(slug, version) of SLUG or SLUG@N, N taken as --env-version N; RolloutError naming WHAT."""
    from rollout.plans import parse_env_ref

    ref = parse_env_ref(value)
    if isinstance(ref, str):
        raise RolloutError(
            f"{what} {value}: {ref}",
            problems=["give SLUG, or SLUG@N (the same as --env-version N)"],
        )
    slug, at = ref
    if at is not None and version is not None and at != version:
        raise RolloutError(f"{what} {value}: names version {at}, but --env-version is {version}")
    return slug, at if at is not None else version


def print_json(document: Any) -> None:
    """Print one JSON document on stdout (for scripts and CI)."""
    json.dump(document, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def note_if_stale(read_models: dict[str, Any] | None) -> None:
    """One line on stderr when the read models the numbers came from are stalled behind."""
    if (note := stale_note(read_models)) is not None:
        print(f"note: {note}", file=sys.stderr)


def note_judges_nothing(what: str, envs: Iterable[str]) -> None:
    """One line on stderr: `what` (rollouts said to pass) came from envs that judge nothing."""
    names = ", ".join(sorted(envs))
    if names:
        print(f"note: {what} of {names}, whose env judges nothing ({NOTHING_SCORED}):"
              ' "passed" means only that the reply ended without a tool error',
              file=sys.stderr)  # fmt: skip


def port_number(value: str) -> int:
    """argparse type of a --port: a TCP port, 0 (any free one) to 65535."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{number} is not a port (0-65535)")
    return number


def shown_status(item: dict[str, Any]) -> str:
    """A run's or job's status as a listing shows it: a failed one that was cancelled says so."""
    if item["status"] == "failed" and (item.get("reason") or "").startswith("cancelled"):
        return "cancelled"
    if item.get("waiting"):
        return "waiting"  # for its owner's earlier runs (the tracker's ROLLOUT_RUNS_PER_OWNER)
    return item["status"]


async def said_when_stopped(work: Awaitable[int], line: Callable[[], str]) -> int:
    """Await `work`; Ctrl-C or SIGTERM stops it at once, says `line()` on stderr, no traceback.

    Await it in asyncio.run's main task, in the main thread: asyncio.run turns Ctrl-C into a
    cancellation of that task, which this lets through once it has said `line()` (asyncio.run
    then raises KeyboardInterrupt: exit 130). SIGTERM (`timeout`, a batch scheduler, `kill`)
    cancels it the same way, rather than a silent death, and this returns 143, the status a
    process killed by SIGTERM has. In a worker thread (asyncio.to_thread) neither reaches it.
    `line` is called when the stop comes, so it can say how far `work` got.
    """
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    terminated = False

    def on_sigterm() -> None:
        nonlocal terminated
        terminated = True
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        handled = True
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
        handled = False
    try:
        return await work
    except asyncio.CancelledError:
        print(line(), file=sys.stderr, flush=True)
        if terminated and task is not None and not task.uncancel():
            return 128 + signal.SIGTERM  # the status a process killed by SIGTERM has
        raise
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGTERM)


class VerbParser(argparse.ArgumentParser):
    """An ArgumentParser that adds some of its arguments on first use (see `later`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._later: list[Callable[[argparse.ArgumentParser], None]] = []

    def _complete(self) -> None:
        while self._later:
            self._later.pop(0)(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As ArgumentParser's, once the deferred arguments are added."""
        self._complete()
        return super().parse_known_args(args, namespace)

    def _parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        # Where every parse ends up, whichever public method (or Python version) started it.
        self._complete()
        return super()._parse_known_args(*args, **kwargs)

    def format_usage(self) -> str:
        """As ArgumentParser's, once the deferred arguments are added."""
        self._complete()
        return super().format_usage()

    def format_help(self) -> str:
        """As ArgumentParser's, once the deferred arguments are added."""
        self._complete()
        return super().format_help()


def later(parser: argparse.ArgumentParser, add: Callable[[argparse.ArgumentParser], None]) -> None:
    """Call `add(parser)` when `parser` parses or prints its help, not now.

    For a verb whose arguments' defaults, choices or help come from a heavy module: building
    every verb's parser (`rollout --help`, any other verb) then does not import it.
    """
    if isinstance(parser, VerbParser):
        parser._later.append(add)
    else:
        add(parser)
