"""Who owns a run, a training job or an environment slug, and who may change it.

The owner is the NATS user whose request created it, read from the request's subject (an
attributed request names its caller, and the server lets a user publish only under its own
name: see subjects.attributed and shared/auth/roles.py). An API key may cancel only what it
started; the admin and the platform's services (a job cancelling its round runs) may cancel
anything. Runs and jobs recorded before owners were kept have none: any runner key may cancel
them, as before. An environment slug is owned the same way, by the key that pushed its first
version (services/env_registry: check_slug_owner); trained model names by their publisher's job
(services/learner/artifacts.py).
"""

from __future__ import annotations

from rollout.shared import subjects
from rollout.shared.auth.keys import key_id_of_user, role_of_user
from rollout.shared.auth.users import is_service_user
from rollout.shared.errors import RolloutError
from rollout.shared.settings import SERVICE_USER_PREFIX


def acts_for_others(caller: str) -> bool:
    """True for the admin and the services (any user that is not an API key)."""
    return role_of_user(caller) is None


def owner_for(caller: str, asked: str | None, what: str) -> str:
    """The owner of what `caller` creates: itself, or `asked` when a service creates it for
    someone (a job's round runs belong to the job's owner); RolloutError for a key asking that."""
    if asked is None or asked == caller:
        return caller
    if not acts_for_others(caller):
        raise RolloutError(
            f"owner: {describe(caller)} may start {what} only for itself, not for {asked!r}"
        )
    subjects.token(asked, "owner")
    return asked


def may_change(caller: str, owner: str | None) -> bool:
    """Whether `caller` may change what `owner` made: its owner, the admin and the services;
    anyone for what was made before owners were kept (`owner` None)."""
    return owner is None or owner == caller or acts_for_others(caller)


def check_may_change(
    caller: str, owner: str | None, what: str, action: str = "cancel", hint: str = ""
) -> None:
    """RolloutError unless `caller` may `action` `what`, owned by `owner`."""
    if may_change(caller, owner):
        return
    raise RolloutError(
        f"{what} was started by {describe(owner)}, not by {describe(caller)}: a key may {action} "
        f"only what it started (ask its owner, or whoever holds the admin credentials){hint}"
    )


def describe(user: str) -> str:
    """A user in words: `key 1a2b3c4d5e6f`, `the learner service`, `user admin`."""
    if (key_id := key_id_of_user(user)) is not None:
        return f"key {key_id}"
    if is_service_user(user):
        return f"the {user.removeprefix(SERVICE_USER_PREFIX)} service"
    if user == subjects.ANONYMOUS:
        return "an unauthenticated connection"
    return f"user {user}"
