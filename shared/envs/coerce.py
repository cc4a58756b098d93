"""Turn what callers hand us (SDK Environment, spec, dict; Task, dict, index) into specs."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from rollout.shared.contracts.envspec import EnvironmentSpec, TaskSpec
from rollout.shared.envs.paths import quoted_path
from rollout.shared.envs.templates import REGISTRY
from rollout.shared.errors import RolloutError


def loc_path(loc: tuple[Any, ...] | list[Any], prefix: str = "") -> str:
    """A pydantic error location as a config path: `config.tools[1].fromArray`, and
    `config["a.b"]` for a key that would read as something else."""
    return quoted_path(loc, prefix) or "<root>"


# A union member pydantic names in an error's location (`command.list[str]`, `command.str`):
# not a key of the input. Where two or more members failed, they are said at the field, on one
# line (a lone match is kept as it is: it may be a key that looks like a type).
_UNION_TAG = re.compile(
    r"(str|int|float|bool|bytes|none|list|dict|tuple|set|frozenset|literal)(\[.*\])?"
    r"|(function-\w+|json-or-python|lax-or-strict|tagged-union|is-instance|nullable|chain)\[.*\]"
)


def _message(err: Any) -> str:
    msg = err["msg"]
    for noise in ("Value error, ", "Assertion failed, "):
        if msg.startswith(noise):
            msg = msg[len(noise) :]
    if err["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling)"
    elif err["type"] == "too_long" and isinstance(err.get("input"), str):
        # Not pydantic's "at most 200 items after validation" of a checked string.
        msg = f"at most {err['ctx']['max_length']} characters, got {len(err['input'])}"
    return msg


def pydantic_problems(exc: ValidationError, prefix: str = "") -> list[str]:
    """One `path: message` line per pydantic error (one per field for a union's members)."""
    rows = []
    for err in exc.errors():
        loc = list(err["loc"])
        at = next(
            (i for i, p in enumerate(loc) if isinstance(p, str) and _UNION_TAG.fullmatch(p)), None
        )
        tag = loc.pop(at) if at is not None else None
        rows.append((loc_path(loc, prefix), tag, _message(err), err["loc"]))
    members: dict[str, int] = {}
    for path, tag, _, _ in rows:
        members[path] = members.get(path, 0) + (tag is not None)
    said: dict[str, list[str]] = {}
    for path, tag, msg, loc in rows:
        if tag is not None and members[path] > 1:
            said.setdefault(path, []).append(f"{msg} ({tag})")
        else:
            said.setdefault(loc_path(loc, prefix), []).append(msg)
    problems = []
    for path, msgs in said.items():
        if len(msgs) > 1 and all(m.endswith(")") for m in msgs) and members.get(path, 0) > 1:
            problems.append(f"{path}: {'; or '.join(msgs)}")
        else:
            problems.extend(f"{path}: {m}" for m in msgs)
    return problems


# What to do about an environment too large for one message (its push request or its event).
TOO_LARGE_HINT = (
    "its spec (config, tasks, plugin sources) travels in one message: make its fixtures, "
    "files or tasks smaller, or split the tasks over several envs"
)


def raw_environment(env: Any) -> dict[str, Any]:
    """The camelCase dict form of an Environment, EnvironmentSpec or dict (not validated)."""
    if isinstance(env, EnvironmentSpec):
        return env.to_json_dict()
    if hasattr(env, "to_raw") and callable(env.to_raw):
        raw = env.to_raw()
        _complete_config(raw)
        return raw
    if isinstance(env, dict):
        return env
    raise RolloutError(
        f"expected an Environment, an EnvironmentSpec or a dict, got {type(env).__name__}"
    )


def _complete_config(raw: dict[str, Any]) -> None:
    # An SDK Environment may need what only the user's machine has (a plugin's own module
    # source): its template adds it, since the services that use it run elsewhere.
    config, template = raw.get("config"), raw.get("template")
    if not isinstance(config, dict) or not isinstance(template, str):
        return

    found = REGISTRY.get(template)
    if found is not None:
        found.complete_config(config)


def as_spec(env: Any) -> EnvironmentSpec:
    """Validate into an EnvironmentSpec; RolloutError listing every problem otherwise."""
    if isinstance(env, EnvironmentSpec):
        return env
    raw = raw_environment(env)
    try:
        return EnvironmentSpec.model_validate(raw)
    except ValidationError as exc:
        slug = raw.get("slug") if isinstance(raw, dict) else None
        raise RolloutError(
            f"environment {slug!r} is invalid", problems=pydantic_problems(exc)
        ) from None


def as_task(spec: EnvironmentSpec, task: Any) -> TaskSpec:
    """A TaskSpec from a TaskSpec/Task, a dict, or an index into the spec's tasks."""
    if isinstance(task, TaskSpec):
        return task
    if isinstance(task, int) and not isinstance(task, bool):
        if not 0 <= task < len(spec.tasks):
            raise RolloutError(
                f"task index {task} out of range: {spec.slug!r} has {len(spec.tasks)} task(s)"
            )
        return spec.tasks[task]
    if isinstance(task, dict):
        try:
            return TaskSpec.model_validate(task)
        except ValidationError as exc:
            raise RolloutError("invalid task", problems=pydantic_problems(exc, "task")) from None
    raise RolloutError(f"expected a Task, a dict or an index, got {type(task).__name__}")
