"""`Environment` and `Task`: what a user writes in their env file (defined in rollout.shared.envs)."""

from rollout.shared.envs.environment import Environment, Task

__all__ = ["Environment", "Task"]
