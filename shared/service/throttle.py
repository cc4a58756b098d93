"""Budgets of requests per key: a key that floods a service is refused cheaply, by name.

Every request a key may send names its caller (subjects.attributed): run creation and
cancel, imports, plan events, job submissions, env pushes and audits, training-set builds,
buffer exports, and every query. Each replica of a service answers a route one message at a
time, so a key sending thousands of them a second held every other key's same request behind
its own, and each one handled was CPU, a Postgres query, or work and storage. Each replica
keeps a token bucket per calling key and class of request (Budget: writes, reads, costly, each
its own setting), so a key's reads never spend its writes. Past it, the request is answered at
once, before its body is even parsed, with `retryAfterS`. The SDK's client waits that out and
resends within its own timeout (a refused request was never handled, so resending is always
safe), so a sweep of runs or an export's pages are paced, not failed. Only API keys are counted:
not services' own users, nor the admin user (unrestricted: it may publish under any name, so
no budget could bind it), nor anonymous connections (token auth or none, where every
connection may do everything anyway).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from faststream import BaseMiddleware

from rollout.shared import subjects
from rollout.shared.contracts.requests import Reply
from rollout.shared.settings import API_KEY_PREFIX, env_number

# The burst a key may send at once after a quiet spell, in seconds of its rate (100 writes by
# default: a plan's sweep of runs goes through unpaced).
BURST_SECONDS = 5.0


@dataclass(frozen=True)
class Budget:
    """One class of requests' budget per key: `env` a second, or `default`; requests, or for a
    `timed` budget the seconds a replica spent handling them; `burst_s` seconds of it saved."""

    what: str  # how the refusal names the class: "write requests"
    env: str
    default: float
    timed: bool = False
    burst_s: float = BURST_SECONDS

    def rate(self) -> float | None:
        """This class's budget a second for one key at one replica (None: no limit)."""
        unit = "seconds a second" if self.timed else "requests a second"
        rate = env_number(self.env, self.default, unit=unit, low=0)
        return rate or None


# Requests that append events, write Postgres and start work (the default class: a new verb
# is budgeted as a write until it is said to be a read).
WRITES = Budget("write requests", "ROLLOUT_WRITES_PER_KEY", 20.0)
# Queries and export pages, in seconds of a replica's handling a second. A count could not
# bind them: a buffer page takes 25-40 ms, so a flood of them was handled one by one slower
# than 50 a second would refill (benchmarks/queries.py; docs/scaling.md, "A key's reads and
# costly requests"). A key may take half of a replica's time, after 2.5 s of handling saved: a
# client that waits for each answer before it asks again spends less than that (its own and
# the network's part of each round trip are not the replica's), so the CLI and `rollout
# export` page unrefused (4,000 rollouts: under 2 s of handling), while a key with thousands
# queued is refused once what it saved is spent, until half of what it took is earned back.
READS = Budget("read requests", "ROLLOUT_READS_PER_KEY", 0.5, timed=True)
# Requests that each cost a replica up to minutes (an audit runs env code for every policy; a
# training set is a query over the whole buffer), which no key's client sends more than one at a
# time (`rollout audit`; training sets are built for the learner's own user, which is exempt).
# A quarter of a replica's time after 2.5 s saved: past those, another key's audit waits about
# one of the flooding key's, not all of them, and a flood of them burns a quarter of a core.
COSTLY = Budget("costly requests", "ROLLOUT_COSTLY_PER_KEY", 0.25, timed=True, burst_s=10.0)

READ_REQUESTS: frozenset[tuple[str, str]] = frozenset(
    {
        ("registry", "get"),
        ("registry", "list"),
        ("tracker", "get_run"),
        ("tracker", "list_runs"),
        ("tracker", "get_job"),
        ("tracker", "list_jobs"),
        # One page of an export, keyset-paged.
        ("buffer", "rollouts"),
    }
)
COSTLY_REQUESTS: frozenset[tuple[str, str]] = frozenset(
    {
        ("registry", "audit"),
        ("buffer", "sft_set"),
        ("buffer", "dpo_pairs"),
        ("buffer", "grpo_groups"),
    }
)
# Kept for the callers of the first budget (writes only).
WRITES_PER_KEY_ENV = WRITES.env
DEFAULT_WRITES_PER_KEY = WRITES.default
# The reply's error, which the client recognises to wait and resend.
RATE_LIMITED = "rate limited"


def budget_of(service: str, verb: str) -> Budget:
    """The budget a key's `verb` request to `service` spends."""
    if (service, verb) in READ_REQUESTS:
        return READS
    if (service, verb) in COSTLY_REQUESTS:
        return COSTLY
    return WRITES


def writes_per_key() -> float | None:
    """Write requests a second one key may make of one replica (None: no limit)."""
    return WRITES.rate()


class KeyBuckets:
    """A token bucket per key: `rate` a second, up to `burst` saved."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)

    def _tokens(self, key: str) -> tuple[float, float]:
        now = self._clock()
        tokens, then = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - then) * self.rate), now

    def take(self, key: str, cost: float = 1.0) -> float:
        """Spend `cost` of `key`'s budget: 0.0 if it had that, else the seconds until it has."""
        tokens, now = self._tokens(key)
        if tokens >= cost:
            self._buckets[key] = (tokens - cost, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (cost - tokens) / self.rate

    def charge(self, key: str, cost: float) -> None:
        """Spend `cost` after the fact (into debt: the key waits until it is paid back).

        What the key earned while its request was handled counts before the cap: a request
        that took c seconds at one second a second leaves its key where it was, even full."""
        now = self._clock()
        tokens, then = self._buckets.get(key, (self.burst, now))
        self._buckets[key] = (min(self.burst, tokens + (now - then) * self.rate - cost), now)


class KeyThrottle:
    """The broker middleware that answers a key past its budget instead of its handler."""

    def __init__(self, rates: dict[Budget, float]) -> None:
        # A budget left out (or set to 0) is no limit; a count's burst is at least one request.
        self.buckets = {
            budget: KeyBuckets(
                rate, rate * budget.burst_s if budget.timed else max(rate * budget.burst_s, 1.0)
            )
            for budget, rate in rates.items()
        }

    @classmethod
    def from_settings(cls) -> KeyThrottle | None:
        """The throttle the environment's budgets ask for (None: every budget is off)."""
        rates = {b: rate for b in (WRITES, READS, COSTLY) if (rate := b.rate()) is not None}
        return cls(rates) if rates else None

    def __call__(self, msg: Any, /, *, context: Any) -> _ThrottleMiddleware:
        return _ThrottleMiddleware(msg, context=context, throttle=self)

    def refusal(self, subject: str) -> Reply | None:
        """The reply to the request on `subject` when its key is over its budget; None when it
        may go on (and for anything but an attributed request: only those name their key)."""
        key = subjects.caller_of(subject)
        if not key.startswith(API_KEY_PREFIX):
            return None
        _, _, service, verb, _ = subject.split(".")
        budget = budget_of(service, verb)
        buckets = self.buckets.get(budget)
        if buckets is None:
            return None
        # A timed budget admits a key out of debt; the handling is charged once it ends.
        wait = buckets.take(key, 0.0 if budget.timed else 1.0)
        if not wait:
            return None
        # Rounded up to the millisecond so the resent request finds a token waiting.
        retry = math.ceil(wait * 1000) / 1000
        used = (
            f"took more than {buckets.rate:g} s a second of the {service}'s time with "
            if budget.timed
            else f"sent more than {buckets.rate:g} "
        )
        return Reply(
            ok=False,
            error=RATE_LIMITED,
            problems=[
                f"key {key!r} {used}{budget.what}"
                f"{'' if budget.timed else ' a second to the ' + service} ({budget.env}); "
                f"retry in {retry:.3f}s"
            ],
            data={"retryAfterS": retry},
        )

    def charge(self, subject: str, seconds: float) -> None:
        """Charge a key's timed budget the `seconds` its request on `subject` was handled."""
        key = subjects.caller_of(subject)
        if not key.startswith(API_KEY_PREFIX):
            return
        _, _, service, verb, _ = subject.split(".")
        budget = budget_of(service, verb)
        if budget.timed and (buckets := self.buckets.get(budget)) is not None:
            buckets.charge(key, seconds)


class _ThrottleMiddleware(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: Any, throttle: KeyThrottle) -> None:
        super().__init__(msg, context=context)
        self.throttle = throttle

    async def consume_scope(self, call_next: Callable[[Any], Awaitable[Any]], msg: Any) -> Any:
        raw = getattr(msg, "raw_message", None)
        subject = getattr(raw, "subject", None) or ""
        refused = self.throttle.refusal(subject)
        if refused is not None:
            return refused
        started = time.monotonic()
        try:
            return await call_next(msg)
        finally:
            self.throttle.charge(subject, time.monotonic() - started)
