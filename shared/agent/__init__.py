"""The agent loop that drives a model through an environment's tools."""

from rollout.shared.agent.loop import (
    DEFAULT_MAX_TOOL_CALLS,
    DEFAULT_SYSTEM_PROMPT,
    Episode,
    SamplingParams,
    run_episode,
    run_episodes,
)

__all__ = [
    "DEFAULT_MAX_TOOL_CALLS",
    "DEFAULT_SYSTEM_PROMPT",
    "Episode",
    "SamplingParams",
    "run_episode",
    "run_episodes",
]
