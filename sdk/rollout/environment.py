"""`Environment` and `Task`: what a user writes in their env file (defined in rollout.shared.envs).

`split_check(tasks)` is what `rollout plan` says about an environment's splits (defined in
rollout.shared.envs.splits; its problems are also part of `validate_environment`).
"""

from rollout.shared.envs.environment import Environment, Task
from rollout.shared.envs.splits import STANDARD_SPLITS, split_check

__all__ = ["Environment", "Task", "STANDARD_SPLITS", "split_check"]
