"""Name an environment to serve: a .py file defining Environment(s), or a registered slug."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rollout.cli._common import client_settings_or_error
from rollout.shared.errors import RolloutError

if TYPE_CHECKING:
    from rollout.shared.contracts.envspec import EnvironmentSpec


def resolve_spec(target: str, slug: str | None = None) -> EnvironmentSpec:
    """FILE (a .py defining Environment(s)) or SLUG (a registered env) as a spec."""
    from rollout.client import Client
    from rollout.shared.contracts.envspec import EnvironmentSpec
    from rollout.shared.envs.loader import load_environments, select_environment

    if target.endswith(".py") or Path(target).is_file():
        envs = select_environment(load_environments(target), slug)
        if len(envs) != 1:
            raise RolloutError(
                f"{target} defines {len(envs)} environments; choose one with --slug "
                f"({', '.join(str(getattr(e, 'slug', '?')) for e in envs)})"
            )
        return envs[0].to_spec()
    with Client(settings=client_settings_or_error()) as client:
        doc = client.get_environment(target)
    return EnvironmentSpec.model_validate(doc.get("spec", doc))
