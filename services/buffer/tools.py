"""The tools a task offered the model, so training examples show the same tool list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nats.js import JetStreamContext

from rollout.shared.envs.engine import start_runtime
from rollout.shared.store.spec_cache import SpecCache


class TaskTools:
    """OpenAI `tools[]` per (env, version, task): built once from the spec, then cached."""

    def __init__(self, js: Callable[[], JetStreamContext]) -> None:
        # A provider: the service's JetStream context exists only once its broker has started.
        self._js = js
        self._specs: SpecCache | None = None
        self._tools: dict[tuple[str, int, int], list[dict[str, Any]]] = {}

    async def get(
        self, env_slug: str, env_version: int, task_index: int, env_hash: str | None = None
    ) -> list[dict[str, Any]]:
        """The tools task `task_index` of the env version offers (RolloutError if unknown)."""
        key = (env_slug, env_version, task_index)
        if key not in self._tools:
            if self._specs is None:
                self._specs = SpecCache(self._js())
            spec = await self._specs.get(env_slug, env_version, env_hash)
            # The runtime the actor built for this task is where the tool list comes from.
            runtime = await start_runtime(spec, task_index)
            try:
                self._tools[key] = [t.to_openai() for t in runtime.tool_specs()]
            finally:
                await runtime.close()
        return self._tools[key]
