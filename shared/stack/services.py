"""The service registry: name -> module with `async def serve(settings) -> None`."""

from __future__ import annotations

import importlib
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import cast

from rollout.shared.errors import RolloutError
from rollout.shared.settings import Settings

SERVICES: dict[str, str] = {
    "env-registry": "rollout.services.env_registry.main",
    "tracker": "rollout.services.tracker.main",
    "actor": "rollout.services.actor.main",
    "verifier": "rollout.services.verifier.main",
    "learner": "rollout.services.learner.main",
    "buffer": "rollout.services.buffer.main",
}

# Extra services, "name=module[:function],..." (plugins and tests); they join the registry.
EXTRA_ENV = "ROLLOUT_EXTRA_SERVICES"
# Which services `rollout up` starts, "name,name"; default: every registered one.
SELECT_ENV = "ROLLOUT_SERVICES"

ServeFn = Callable[[Settings], Awaitable[None]]


def registry(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """SERVICES plus those named in ROLLOUT_EXTRA_SERVICES."""
    env = os.environ if env is None else env
    found = dict(SERVICES)
    for item in filter(None, (part.strip() for part in env.get(EXTRA_ENV, "").split(","))):
        name, sep, module = item.partition("=")
        if not sep or not name.strip() or not module.strip():
            raise RolloutError(f"{EXTRA_ENV}: {item!r} is not name=module")
        found[name.strip()] = module.strip()
    return found


def selected(env: Mapping[str, str] | None = None) -> list[str]:
    """The services `rollout up` runs, validated against the registry."""
    env = os.environ if env is None else env
    known = registry(env)
    raw = env.get(SELECT_ENV)
    if raw is None:
        return list(known)
    names = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise RolloutError(
            f"{SELECT_ENV}: unknown service(s) {', '.join(unknown)}",
            problems=[f"known: {', '.join(sorted(known))}"],
        )
    return names


def load_serve(name: str, env: Mapping[str, str] | None = None) -> ServeFn:
    """Import a service's module and return its entry (`serve`, or the `module:function` named)."""
    known = registry(env)
    if name not in known:
        raise RolloutError(
            f"unknown service {name!r}", problems=[f"known: {', '.join(sorted(known))}"]
        )
    module_name, _, attr = known[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise RolloutError(f"service {name!r}: cannot import {module_name} ({exc})") from exc
    serve = getattr(module, attr or "serve", None)
    if serve is None:
        raise RolloutError(f"service {name!r}: {module_name} has no `{attr or 'serve'}` coroutine")
    return cast(ServeFn, serve)
