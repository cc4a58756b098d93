"""A budget of write requests per key: a key that floods a service is refused cheaply, by name.

Attributed requests (subjects.ATTRIBUTED: run creation and cancel, imports, plan events, job
submissions, env pushes) are the ones that append events, write Postgres and start work. Each
replica of a service answers one at a time, so a key sending thousands of them a second held
every other key's request behind its own, and each one recorded became work or storage. Each
replica keeps a token bucket per calling key (`ROLLOUT_WRITES_PER_KEY` a second, a burst of
BURST_SECONDS' worth): past it, the request is answered at once, before its body is even
parsed, with `retryAfterS`. The SDK's client waits that out and resends within its own timeout
(a refused request was never handled, so resending is always safe), so a sweep of runs is
paced, not failed. Services' own users and anonymous connections (token auth or none, where
every connection may do everything anyway) are not counted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from faststream import BaseMiddleware

from rollout.shared import subjects
from rollout.shared.contracts.requests import Reply
from rollout.shared.settings import SERVICE_USER_PREFIX, env_number

WRITES_PER_KEY_ENV = "ROLLOUT_WRITES_PER_KEY"
DEFAULT_WRITES_PER_KEY = 20.0
# The burst a key may send at once after a quiet spell, in seconds of its rate (100 by
# default: a plan's sweep of runs goes through unpaced).
BURST_SECONDS = 5.0
# The reply's error, which the client recognises to wait and resend.
RATE_LIMITED = "rate limited"


def writes_per_key() -> float | None:
    """Write requests a second one key may make of one replica (None: no limit)."""
    rate = env_number(WRITES_PER_KEY_ENV, DEFAULT_WRITES_PER_KEY, unit="requests a second", low=0)
    return rate or None


class KeyBuckets:
    """A token bucket per key: `rate` a second, up to `burst` saved."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)

    def take(self, key: str) -> float:
        """Spend one request of `key`'s budget: 0.0 if it had one, else the seconds until it has."""
        now = self._clock()
        tokens, then = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate


class KeyThrottle:
    """The broker middleware that answers a key past its budget instead of its handler."""

    def __init__(self, rate: float) -> None:
        self.buckets = KeyBuckets(rate, rate * BURST_SECONDS)

    def __call__(self, msg: Any, /, *, context: Any) -> _ThrottleMiddleware:
        return _ThrottleMiddleware(msg, context=context, throttle=self)

    def refusal(self, subject: str) -> Reply | None:
        """The reply to the request on `subject` when its key is over its budget; None when it
        may go on (and for anything but an attributed request: only those name their key)."""
        key = subjects.caller_of(subject)
        if key == subjects.ANONYMOUS or key.startswith(SERVICE_USER_PREFIX):
            return None
        wait = self.buckets.take(key)
        if not wait:
            return None
        # Rounded up to the millisecond so the resent request finds a token waiting.
        retry = math.ceil(wait * 1000) / 1000
        rate = self.buckets.rate
        return Reply(
            ok=False,
            error=RATE_LIMITED,
            problems=[
                f"key {key!r} sent more than {rate:g} write requests a second to the "
                f"{subject.split('.')[2]} ({WRITES_PER_KEY_ENV}); retry in {retry:.3f}s"
            ],
            data={"retryAfterS": retry},
        )


class _ThrottleMiddleware(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: Any, throttle: KeyThrottle) -> None:
        super().__init__(msg, context=context)
        self.throttle = throttle

    async def consume_scope(self, call_next: Callable[[Any], Awaitable[Any]], msg: Any) -> Any:
        raw = getattr(msg, "raw_message", None)
        refused = self.throttle.refusal(getattr(raw, "subject", None) or "")
        if refused is not None:
            return refused
        return await call_next(msg)
