"""Environment specs by (slug, version), read once from the events stream and kept."""

from __future__ import annotations

from nats.js import JetStreamContext

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.envs.coerce import as_spec
from rollout.shared.errors import RolloutError
from rollout.shared.store import env_versions


class SpecCache:
    """Specs are immutable per version, so a cache entry never goes stale."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._specs: dict[tuple[str, int], EnvironmentSpec] = {}

    async def get(
        self, slug: str, version: int, expected_hash: str | None = None
    ) -> EnvironmentSpec:
        """The spec of one environment version (RolloutError if it does not exist)."""
        key = (slug, version)
        if key not in self._specs:
            found = await env_versions.version(self._js, slug, version)
            if found is None:
                raise RolloutError(f"environment {slug!r} version {version} is not registered")
            if expected_hash and found.spec_hash != expected_hash:
                raise RolloutError(
                    f"environment {slug!r} version {version} has hash {found.spec_hash[:12]},"
                    f" the run expected {expected_hash[:12]}"
                )
            self._specs[key] = as_spec(found.spec)
        return self._specs[key]
