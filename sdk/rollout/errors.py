"""The one exception type users see: a clear message, never a traceback."""

from __future__ import annotations


class RolloutError(Exception):
    """A user-facing error; the CLI prints its message and exits 1."""

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.problems = list(problems or [])

    def __str__(self) -> str:
        if not self.problems:
            return self.message
        return self.message + "\n" + "\n".join(f"  - {p}" for p in self.problems)
