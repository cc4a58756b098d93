"""The audit's defaults, apart from its runner so that `rollout audit`'s help can show them."""

# A policy scoring at least this on a task makes the task hackable.
DEFAULT_THRESHOLD = 0.75
# An episode running longer ends as an error.
EPISODE_TIMEOUT_S = 60.0
