"""nats-py 2.16's pull `fetch` can time out with a bare `asyncio.TimeoutError`: make it nats'.

When the first (no-wait) probe of `JetStreamContext.PullSubscription._fetch_n` returns nothing
and the caller's deadline is already spent, nats-py raises `asyncio.TimeoutError` instead of
`nats.errors.TimeoutError` (nats/js/client.py, "if deadline is not None and deadline <= 0").
FastStream's pull loop catches only nats' subclass, so an idle consumer's ordinary empty poll
surfaced as "Task raised an exception, retrying..." with a traceback in every healthy service.
The wrapper turns that one case into the documented error; everything else passes through.
"""

from __future__ import annotations

import functools
from typing import Any

import nats.errors
from nats.js.client import JetStreamContext

_MARK = "_rollout_nats_timeouts"


def install() -> None:
    """Wrap `PullSubscription.fetch` once per process (idempotent)."""
    cls = JetStreamContext.PullSubscription
    original = cls.fetch
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    async def fetch(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await original(self, *args, **kwargs)
        except nats.errors.TimeoutError:
            raise
        except TimeoutError as exc:  # asyncio.TimeoutError is the builtin
            raise nats.errors.TimeoutError from exc

    setattr(fetch, _MARK, True)
    cls.fetch = fetch  # type: ignore[method-assign]


install()
