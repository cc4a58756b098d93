"""The one exception type users see (defined in rollout.shared.errors; re-exported here)."""

from rollout.shared.errors import RolloutError

__all__ = ["RolloutError"]
