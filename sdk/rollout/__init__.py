"""rollout: write agent environments in Python, run models on them, score, train, compare."""

from rollout.errors import RolloutError

__all__ = ["RolloutError"]
