"""The NATS user names of the platform's services: light enough for the CLI's credentials.

shared/auth/services.py declares what each service may do (with the durable consumers, and so
faststream); naming a service's user needs none of that.
"""

from __future__ import annotations

from rollout.shared import subjects
from rollout.shared.settings import SERVICE_USER_PREFIX


def service_user(service: str) -> str:
    """The NATS user of a service (`svc_tracker`)."""
    return f"{SERVICE_USER_PREFIX}{subjects.token(service, 'service')}"


def is_service_user(user: str | None) -> bool:
    """True for a service's own user name."""
    return bool(user) and user.startswith(SERVICE_USER_PREFIX)  # type: ignore[union-attr]
