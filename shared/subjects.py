"""Every NATS subject, stream and bucket name in one place: nothing else builds subject strings."""

from __future__ import annotations

import re

PREFIX = "rollout"

EVENTS_STREAM = "ROLLOUT_EVENTS"
WORK_STREAM = "ROLLOUT_WORK"
HEARTBEATS_BUCKET = "rollout_heartbeats"
POLICY_BUCKET = "rollout_policy"
OBJECTS_BUCKET = "rollout_objects"
LEASES_BUCKET = "rollout_leases"

ALL_EVENTS = f"{PREFIX}.evt.>"
ALL_WORK = f"{PREFIX}.work.>"

# Aggregates whose histories live on the events stream, one subject family each.
AGGREGATES = ("env", "run", "job", "policy", "deadletter", "plan", "key", "quota")

_TOKEN = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")


class SubjectError(ValueError):
    """A value cannot be used as a subject token."""


def token(value: str, what: str = "id") -> str:
    """Return `value` if it is a safe single subject token, else raise SubjectError."""
    if not isinstance(value, str) or not _TOKEN.match(value):
        # A hostile value may be a megabyte: the error names its start and its length, so the
        # reply and the log line stay small.
        shown = repr(value[:64]) + (f"... ({len(value)} characters)" if len(value) > 64 else "")
        if not isinstance(value, str):
            shown = repr(value)[:80]
        raise SubjectError(
            f"{what} {shown} must be 1-128 characters of letters, digits, '-' or '_'"
        )
    return value


def event(aggregate: str, aggregate_id: str, name: str) -> str:
    """Subject of one event: `rollout.evt.<aggregate>.<id>.<name>`."""
    if aggregate not in AGGREGATES:
        raise SubjectError(f"unknown aggregate {aggregate!r}; known: {', '.join(AGGREGATES)}")
    return f"{PREFIX}.evt.{aggregate}.{token(aggregate_id)}.{token(name, 'event name')}"


def aggregate_events(aggregate: str, aggregate_id: str = "*") -> str:
    """Filter for one aggregate's history (or every instance with `*`)."""
    agg_id = aggregate_id if aggregate_id == "*" else token(aggregate_id)
    return f"{PREFIX}.evt.{aggregate}.{agg_id}.*"


def event_name(event_type: str) -> str:
    """The subject token of an event type: `rollout.scored` -> `rollout_scored`."""
    return token(event_type.replace(".", "_"), "event type")


def event_filter(aggregate: str, event_type: str) -> str:
    """Filter for one event type across every instance of an aggregate."""
    if aggregate not in AGGREGATES:
        raise SubjectError(f"unknown aggregate {aggregate!r}; known: {', '.join(AGGREGATES)}")
    return f"{PREFIX}.evt.{aggregate}.*.{event_name(event_type)}"


def run_events(run_id: str = "*") -> str:
    """Filter for one run's history."""
    return aggregate_events("run", run_id)


DEAD_LETTER_EVENT = "deadletter.recorded"


def dead_letter(consumer: str = "*") -> str:
    """Subject of the dead letters one consumer records (`*`: every consumer's).

    The recording durable is the aggregate id, `rollout.evt.deadletter.<consumer>.
    deadletter_recorded`: a service's NATS user may publish dead letters only under its own
    consumers' names (rollout.shared.auth.services), so a follower that filters on one consumer
    acts only on what that consumer itself recorded.
    """
    recorder = consumer if consumer == "*" else token(consumer, "consumer")
    return f"{PREFIX}.evt.deadletter.{recorder}.{event_name(DEAD_LETTER_EVENT)}"


def work(kind: str, key: str) -> str:
    """Subject of a work item: `rollout.work.<kind>.<key>`."""
    return f"{PREFIX}.work.{token(kind, 'work kind')}.{token(key)}"


def work_filter(kind: str) -> str:
    """Filter for every work item of one kind."""
    return f"{PREFIX}.work.{token(kind, 'work kind')}.>"


# Requests one service sends another (no key may send them: shared/auth/roles.py INTERNAL).
# Every other request is attributed: its subject ends with the caller's NATS user, and the
# server lets a user publish only under its own name (shared/auth), so the service knows who is
# asking: the owner of what it creates (runs, jobs, environment slugs), who may cancel it, and
# whose budget a request spends (shared/service/throttle.py). Attribution is the default so
# that no request a key may send is ever anonymous to the service that answers it.
SERVICE_ONLY: frozenset[tuple[str, str]] = frozenset({("actor", "check_model")})


def attributed(service: str, verb: str) -> bool:
    """Whether a request's subject names its caller: every request but SERVICE_ONLY's."""
    return (service, verb) not in SERVICE_ONLY


# The caller token of a connection with no user name (token auth, or no auth at all, where
# every connection may do everything anyway).
ANONYMOUS = "anonymous"


def caller_token(user: str | None) -> str:
    """The subject token naming `user` as a caller (ANONYMOUS without a usable user name)."""
    return user if user and _TOKEN.match(user) else ANONYMOUS


def request(service: str, verb: str, caller: str | None = None) -> str:
    """Subject of a request/reply command: `rollout.req.<service>.<verb>`, followed by the
    caller's user (`caller_token`) for an attributed request."""
    return _with_caller(service, verb, caller_token(caller))


def request_filter(service: str, verb: str) -> str:
    """What a service subscribes to for `verb`: the request subject, any caller's if attributed."""
    return _with_caller(service, verb, "*")


def _with_caller(service: str, verb: str, caller: str) -> str:
    subject = f"{PREFIX}.req.{token(service, 'service')}.{token(verb, 'verb')}"
    return f"{subject}.{caller}" if attributed(service, verb) else subject


def caller_of(subject: str) -> str:
    """The caller an attributed request's subject names (ANONYMOUS for any other subject)."""
    parts = subject.split(".")
    if (
        len(parts) == 5
        and parts[0] == PREFIX
        and parts[1] == "req"
        and attributed(parts[2], parts[3])
    ):
        return parts[4]
    return ANONYMOUS


def parse_event_subject(subject: str) -> tuple[str, str, str]:
    """Split an event subject into (aggregate, id, name)."""
    parts = subject.split(".")
    if len(parts) != 5 or parts[0] != PREFIX or parts[1] != "evt":
        raise SubjectError(f"not an event subject: {subject!r}")
    return parts[2], parts[3], parts[4]


# NATS-level subjects used in user permissions (the server's own API and per-user inboxes).
JS_API = "$JS.API"
USER_INFO = "$SYS.REQ.USER.INFO"


def js_api(*tokens: str) -> str:
    """A JetStream API subject: `$JS.API.<tokens>` (wildcards allowed, for permissions)."""
    return ".".join((JS_API, *tokens))


def inbox_prefix(user: str) -> str:
    """A user's private reply-subject prefix, `_INBOX_<user>`: no one else may read its replies."""
    return f"_INBOX_{token(user, 'user')}"


def inbox_filter(user: str) -> str:
    """Every reply subject under a user's private inbox prefix."""
    return f"{inbox_prefix(user)}.>"
