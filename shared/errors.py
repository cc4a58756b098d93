"""Errors: the user-facing kind (a clear message, never a traceback) and internal retry signals."""

from __future__ import annotations


class _Explained(Exception):
    """An error with a one-line message and, optionally, the problems behind it."""

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.problems = list(problems or [])

    def __str__(self) -> str:
        if not self.problems:
            return self.message
        return self.message + "\n" + "\n".join(f"  - {p}" for p in self.problems)


class RolloutError(_Explained):
    """A user-facing error; the CLI prints its message and exits 1."""


class RetrySignal(_Explained):
    """Internal: the operation may succeed if tried again (a conflict, a dependency restarting).

    Not a RolloutError, so code that turns user errors into a failed job or run never swallows
    one: the caller's retry loop, or the broker's redelivery, sees it instead.
    """
