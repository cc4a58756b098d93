"""Fail a refused request at once: nats-server reports a permissions violation asynchronously.

A publish the user may not make is dropped by the server, which sends `-ERR 'Permissions
Violation for Publish to "<subject>"'`; nats-py hands that to the connection's error callback
and the request itself would only time out. The watch matches the violation to the pending
request on that subject and fails it with a clear error.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from typing import TypeVar

from rollout.shared.auth.keys import role_of_user
from rollout.shared.auth.roles import denied_action, roles_allowed
from rollout.shared.errors import RolloutError
from rollout.shared.settings import is_permission_violation

T = TypeVar("T")

_VIOLATION = re.compile(r'violation for (publish|subscription) to "([^"]+)"', re.IGNORECASE)


def violated_subject(exc: BaseException) -> str | None:
    """The subject a permissions violation names (nats-py lowercases it), else None."""
    if not is_permission_violation(exc):
        return None
    found = _VIOLATION.search(str(exc))
    return found.group(2) if found else None


def denial(user: str | None, subject: str) -> RolloutError:
    """`permission denied: a viewer key cannot push environments`, with what would allow it."""
    role = role_of_user(user)
    who = f"a {role.value} key" if role else f"user {user}" if user else "this connection"
    problems = []
    parts = subject.split(".")
    # A request subject: `rollout.req.<service>.<verb>`, then the caller for an attributed one.
    if len(parts) in (4, 5) and parts[1] == "req":
        allowed = [r.value for r in roles_allowed(parts[2], parts[3])]
        problems.append(
            f"this needs a {' or '.join(allowed)} key"
            f" (the operator makes one: `rollout keys create --role {allowed[0]}`)"
            if allowed
            else "no API key may do this; only the platform's services can"
        )
    return RolloutError(
        f"permission denied: {who} cannot {denied_action(subject)}", problems=problems
    )


class PermissionWatch:
    """Pending requests by subject; a violation on a subject fails its pending requests."""

    def __init__(self, user: str | None) -> None:
        self.user = user
        self._pending: list[tuple[str, asyncio.Future[None]]] = []

    async def error_cb(self, exc: Exception) -> None:
        """The connection's error callback (chained by connect_nats)."""
        if "authorization violation" in str(exc).lower():
            # The server dropped us and refuses the key on reconnect (revoked): fail what waits.
            for _, future in self._pending:
                if not future.done():
                    future.set_exception(
                        RolloutError(
                            f"the server no longer accepts {self.user or 'these credentials'}",
                            problems=["the key was probably revoked; log in with a valid key"],
                        )
                    )
            return
        subject = violated_subject(exc)
        if subject is None:
            return
        for pending, future in self._pending:
            # nats-py lowercases the server's message, so compare case-insensitively.
            if pending.lower() == subject.lower() and not future.done():
                future.set_exception(denial(self.user, pending))

    async def guard(self, subject: str, work: Awaitable[T]) -> T:
        """Await `work` (a request on `subject`), failing fast if the server refuses it."""
        refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (subject, refused)
        self._pending.append(entry)
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait({task, refused}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            task.cancel()
            refused.result()  # raises the denial
            raise AssertionError("unreachable")
        finally:
            self._pending.remove(entry)
            if not task.done():
                task.cancel()
