"""`rollout keys limit` and the limits in `keys create` and `keys list`: a key's daily budgets.

The limits are events on the platform's log (shared/aggregates/quota.py), appended by the
operator as the admin user of ROLLOUT_HOME's stack, so every service replica reads the same
ones; the stack must be running to set or show them.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rollout.errors import RolloutError
from rollout.shared.settings import connect_nats, load_settings

if TYPE_CHECKING:
    # The client stack loads only when a verb runs: `keys --help` stays light.
    from rollout.shared.contracts.events import KeyLimitsSet

T = TypeVar("T")
# The flags, as `rollout keys create` and `keys limit` take them, and the limit each sets.
FLAGS: dict[str, str] = {
    "max_rollouts_per_day": "--max-rollouts-per-day",
    "max_jobs_per_day": "--max-jobs-per-day",
}
# What each limit counts, as the flags' help says it.
_COUNTED: dict[str, str] = {
    "max_rollouts_per_day": "rollouts (tasks x n) its runs may plan a UTC day",
    "max_jobs_per_day": "training jobs it may create a UTC day",
}


def limit_value(text: str) -> int | None:
    """A limit as given: a whole number of at least 0, or `none` (no limit)."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a limit: give a whole number >= 0, or `none` to lift it"
        )
    return value


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """The limit flags of `keys create` and `keys limit` (left out: unchanged)."""
    for field, flag in FLAGS.items():
        parser.add_argument(
            flag,
            dest=field,
            type=limit_value,
            default=argparse.SUPPRESS,
            metavar="N",
            help=f"{_COUNTED[field]}; `none`: no limit",
        )


def limit_changes(args: argparse.Namespace) -> dict[str, int | None]:
    """The limits the command line sets (field -> limit or None)."""
    return {name: getattr(args, name) for name in FLAGS if hasattr(args, name)}


def stack_running(home: Path) -> bool:
    """Whether ROLLOUT_HOME's NATS runs (limits are on its log)."""
    from rollout.shared.stack.nats import running_nats_nodes

    return bool(running_nats_nodes(home))


def require_running(home: Path, what: str) -> None:
    """A clear error when the stack whose log keeps the limits is down."""
    if not stack_running(home):
        raise RolloutError(
            f"{what}: a key's limits are kept on the platform's event log, and the stack in "
            f"{home} is not running",
            problems=["start it with `rollout up`, then set the limits again"],
        )


def _on_log(work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(js)` on the stack's log as its admin user."""
    import nats.errors

    async def main() -> T:
        nc = await connect_nats(load_settings(), allow_reconnect=False)
        try:
            return await work(nc.jetstream())
        except nats.errors.Error as exc:
            # No events stream yet (the tracker creates it as the stack starts), or none
            # answering: said in a line, not a traceback.
            raise RolloutError(
                f"the platform's event log did not answer ({type(exc).__name__}: {exc})",
                problems=["check the stack with `rollout status`, then try again"],
            ) from None
        finally:
            await nc.close()

    return asyncio.run(main())


def set_limits(key_id: str, changes: dict[str, int | None]) -> KeyLimitsSet:
    """Record a key's new limits on the log."""
    from rollout.shared.aggregates import quota

    return _on_log(lambda js: quota.set_limits(js, key_id, changes))


def usage(key_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each key's limits and what it used today (UTC), by key id."""
    from rollout.shared.aggregates import quota

    day = quota.day_of(datetime.now(UTC))

    async def read(js: Any) -> dict[str, dict[str, Any]]:
        found = {}
        for key_id in key_ids:
            limits, _ = await quota.key_limits(js, key_id)
            used = await quota.key_day(js, key_id, day)
            found[key_id] = {
                "limits": {
                    "maxRolloutsPerDay": limits.max_rollouts_per_day,
                    "maxJobsPerDay": limits.max_jobs_per_day,
                },
                "used": dict(used.used),
                "day": f"{day[:4]}-{day[4:6]}-{day[6:]}",
            }
        return found

    return _on_log(read)


def describe_limits(limits: KeyLimitsSet) -> str:
    """`rollouts 6 a day, jobs unlimited`."""
    rollouts, jobs = limits.max_rollouts_per_day, limits.max_jobs_per_day
    return (
        f"rollouts {'unlimited' if rollouts is None else f'{rollouts} a day'}, "
        f"jobs {'unlimited' if jobs is None else f'{jobs} a day'} (UTC days)"
    )
