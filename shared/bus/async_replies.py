"""nats-py 2.16 leaves a refused `publish_async` pending: make its future fail with the refusal.

`JetStreamContext._handle_async_reply` turns an error reply into an exception with
`APIError.from_error`, which raises it rather than returning it (nats/js/errors.py), so the
exception escapes the subscription callback and the publish's future is never done. A refused
publish (a full stream, a wrong expected stream) then looked like a lost ack: `queue_work` and
`EventPublisher.publish_batch` waited out their whole ack timeout (30 s) instead of failing at
once. The wrapper sets the raised refusal on the future; everything else passes through.
"""

from __future__ import annotations

import functools
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

_MARK = "_rollout_async_replies"
# The reply subject is the async reply prefix (the inbox prefix, a 22-character NUID and a
# dot) then the publish's token: as nats-py itself reads it back.
_PREFIX_EXTRA = 22 + 2


def install() -> None:
    """Wrap `JetStreamContext._handle_async_reply` once per process (idempotent)."""
    original = JetStreamContext._handle_async_reply
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    async def handle(self: Any, msg: Msg) -> None:
        try:
            await original(self, msg)
        except nats.js.errors.APIError as exc:
            token = msg.subject[len(self._nc._inbox_prefix) + _PREFIX_EXTRA :]
            future = self._publish_async_futures.get(token)
            if future is not None and not future.done():
                future.set_exception(exc)

    setattr(handle, _MARK, True)
    JetStreamContext._handle_async_reply = handle  # type: ignore[method-assign]


install()
