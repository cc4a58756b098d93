"""Turn what callers hand us (SDK Environment, spec, dict; Task, dict, index) into specs."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from rollout.shared.contracts.envspec import EnvironmentSpec, TaskSpec
from rollout.shared.envs.templates import REGISTRY
from rollout.shared.errors import RolloutError


def loc_path(loc: tuple[Any, ...] | list[Any], prefix: str = "") -> str:
    """A pydantic error location as a config path: `config.tools[1].fromArray`."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def pydantic_problems(exc: ValidationError, prefix: str = "") -> list[str]:
    """One `path: message` line per pydantic error."""
    problems = []
    for err in exc.errors():
        msg = err["msg"]
        for noise in ("Value error, ", "Assertion failed, "):
            if msg.startswith(noise):
                msg = msg[len(noise) :]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling)"
        elif err["type"] == "too_long" and isinstance(err.get("input"), str):
            # Not pydantic's "at most 200 items after validation" of a checked string.
            msg = f"at most {err['ctx']['max_length']} characters, got {len(err['input'])}"
        problems.append(f"{loc_path(err['loc'], prefix)}: {msg}")
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
