"""Roles and the requests each may make (shared/auth/permissions.py: the NATS permissions).

`service` is the platform's own side: the unrestricted admin user (`rollout admin`, `rollout
keys`) and each service's own user, whose least permissions come from its declaration in
shared/auth/services.py; `runner` may query, follow the event log, push environments, start runs
and training jobs; `viewer` may only query and follow.
Every (service, verb) request subject a service answers must be listed in QUERIES, MUTATIONS or
INTERNAL (between services only):
tests/auth checks that, so a new verb cannot silently become unreachable or over-exposed.
Every request a key may send ends with the key's user (subjects.attributed; INTERNAL ones are
subjects.SERVICE_ONLY), and a key may publish only under its own name: a service knows which
key asks, for ownership and for the key's budgets (shared/service/throttle.py).
"""

from __future__ import annotations

from enum import StrEnum

from rollout.shared import subjects


class Role(StrEnum):
    """Who a NATS user is allowed to be."""

    SERVICE = "service"
    RUNNER = "runner"
    VIEWER = "viewer"


# Roles an API key may have; services keep their own generated credentials.
KEY_ROLES: tuple[Role, ...] = (Role.RUNNER, Role.VIEWER)

# Read-only requests: every key may make them.
QUERIES: dict[tuple[str, str], str] = {
    ("registry", "get"): "read environments",
    ("registry", "list"): "list environments",
    ("tracker", "get_run"): "read runs",
    ("tracker", "list_runs"): "list runs",
    ("tracker", "get_job"): "read training jobs",
    ("tracker", "list_jobs"): "list training jobs",
}

# Requests that change the platform (or build training data from it): runner keys only.
MUTATIONS: dict[tuple[str, str], str] = {
    ("registry", "push"): "push environments",
    ("registry", "audit"): "audit environments",
    ("tracker", "create_run"): "start runs",
    ("tracker", "cancel_run"): "cancel runs",
    ("learner", "create_job"): "create training jobs",
    ("learner", "cancel_job"): "cancel training jobs",
    ("tracker", "record_plan_event"): "run experiment plans",
    ("tracker", "import_run"): "import runs",
    ("buffer", "sft_set"): "build training sets",
    ("buffer", "dpo_pairs"): "build training sets",
    ("buffer", "grpo_groups"): "build training sets",
    # The buffer serves training data across runs; the runs a key may read (trajectories too)
    # it may also export, run by run.
    ("buffer", "rollouts"): "select rollouts from the buffer (export the runs it reads with "
    "--run or --env)",
}

# Requests one service sends another: no key may send them (a service's own user only). Their
# subjects name no caller: subjects.SERVICE_ONLY holds the same verbs (tests/auth checks).
INTERNAL: dict[tuple[str, str], str] = {
    ("actor", "check_model"): "check, for the tracker, that the actors can generate with a model",
}

ROLE_REQUESTS: dict[Role, tuple[tuple[str, str], ...]] = {
    Role.VIEWER: tuple(QUERIES),
    Role.RUNNER: (*QUERIES, *MUTATIONS),
}


def denied_action(subject: str) -> str:
    """What a refused publish to `subject` was trying to do, in words."""
    parts = subject.split(".")
    if len(parts) in (4, 5) and parts[0] == subjects.PREFIX and parts[1] == "req":
        key = (parts[2], parts[3])
        return MUTATIONS.get(key) or QUERIES.get(key) or f"call {parts[2]} {parts[3]}"
    if subject.upper().startswith(subjects.JS_API):
        return "use the JetStream API beyond reading the events stream"
    return f"publish to {subject}"


def roles_allowed(service: str, verb: str) -> list[Role]:
    """The key roles that may make a request (for error messages)."""
    return [role for role in KEY_ROLES if (service, verb) in ROLE_REQUESTS[role]]
