"""`rollout serve-model`: a model behind an OpenAI-compatible API, following its new versions.

The socket is bound before the model loads (a busy port fails at once), the model is resolved
by name like any actor model (`local/tiny-agent`, `hf:DIR`, a trained `BASE:SUFFIX` or job id),
and, for a trained policy, the server follows `policy.updated` of its name on the stack's
events stream and switches to each new version without a failed request.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from rollout.services.inference.defaults import DEFAULT_PORT as DEFAULT_PORT
from rollout.services.inference.exposure import DEFAULT_HOST as DEFAULT_HOST
from rollout.services.inference.server import Running, serving


async def serve_forever(
    model: str,
    sock: socket.socket,
    *,
    announce: Callable[[Running], None] = lambda running: None,
    **options: Any,
) -> None:
    """Serve until cancelled (or the server stops)."""
    async with serving(model, sock, **options) as running:
        announce(running)
        await running.task
