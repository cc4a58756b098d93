"""Who a connection is, as the server sees it (`$SYS.REQ.USER.INFO`): for `whoami` and login."""

from __future__ import annotations

import json
from typing import Any

import nats.errors

from rollout.shared import subjects
from rollout.shared.auth.keys import key_id_of_user, role_of_user
from rollout.shared.auth.roles import Role
from rollout.shared.auth.users import is_service_user
from rollout.shared.errors import RolloutError


async def server_identity(nc: Any, timeout_s: float = 5.0) -> dict[str, Any]:
    """The authenticated user, its role and key id, from the server's own answer."""
    try:
        msg = await nc.request(subjects.USER_INFO, b"", timeout=timeout_s)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        raise RolloutError(f"the server did not say who this connection is ({exc})") from None
    try:
        answer = json.loads(msg.data)
    except json.JSONDecodeError:
        raise RolloutError("the server's user info answer is not JSON") from None
    if answer.get("error"):
        raise RolloutError(f"the server refused user info: {answer['error']}")
    data = answer.get("data") or {}
    user = data.get("user")
    role = role_of_user(user)
    if role is None:
        # Not an API key: the admin (no limits) or a service's own user (its role's limits).
        role = Role.SERVICE if not data.get("permissions") or is_service_user(user) else None
    return {
        "user": user,
        "keyId": key_id_of_user(user),
        "role": role.value if role else "custom",
        "account": data.get("account"),
    }
