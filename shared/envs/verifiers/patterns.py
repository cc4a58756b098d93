"""Regular expressions an environment's author wrote, run on what a model wrote, in bounded time.

A pattern with nested repetition (`(a|aa)+$`) backtracks exponentially on a crafted answer;
run with Python's `re` on the verifier's event loop, one such rollout stalled scoring for every
user. Patterns here run on the `regex` engine (Python's syntax) with a time budget per
primitive, off the event loop and with the GIL released, and a pattern that runs out fails the
check: a model that makes the author's pattern slow gains nothing by it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import regex

# What one primitive's searches may take together, in seconds.
PATTERN_BUDGET_S = 0.5


class PatternTooSlow(Exception):
    """The pattern ran past its time budget on this text."""


def pattern_problem(pattern: Any) -> str | None:
    """Why `pattern` is not a regular expression (None when it is one)."""
    try:
        regex.compile(str(pattern))
    except regex.error as exc:
        return f"not a regular expression: {exc}"
    return None


class BoundedPattern:
    """A compiled pattern whose searches share one time budget."""

    def __init__(
        self, pattern: str, *, ignore_case: bool = False, budget_s: float = PATTERN_BUDGET_S
    ) -> None:
        self.pattern = pattern
        self.budget_s = budget_s
        self._compiled = regex.compile(pattern, regex.IGNORECASE if ignore_case else 0)
        self._deadline: float | None = None

    def search(self, text: str) -> bool:
        """Whether the pattern occurs in `text`; PatternTooSlow once the budget is spent."""
        if self._deadline is None:
            self._deadline = time.monotonic() + self.budget_s
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise PatternTooSlow(self.too_slow())
        try:
            return self._compiled.search(text, timeout=left, concurrent=True) is not None
        except TimeoutError:
            raise PatternTooSlow(self.too_slow()) from None

    def too_slow(self) -> str:
        """The reason a check fails when the budget ran out."""
        return (
            f"the pattern /{self.pattern[:80]}/ ran past {self.budget_s:g} s on this text "
            "(nested repetition backtracks: simplify it); scored as failed"
        )


async def search_any(pattern: BoundedPattern, texts: list[str]) -> bool:
    """Whether the pattern occurs in any of `texts`, searched in a worker thread."""
    return await asyncio.to_thread(lambda: any(pattern.search(t) for t in texts))
