"""Work items on the work stream: a batch of rollouts for one actor call."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rollout.shared.contracts.budgets import Budgets
from rollout.shared.contracts.events import SamplingParams


class RolloutItem(BaseModel):
    """One rollout to generate: a task, a sample index and its seed."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    task_index: int
    sample_index: int
    seed: int


class RolloutWork(BaseModel):
    """A batch of rollouts of one run, pulled by one actor replica (work stealing)."""

    model_config = ConfigDict(extra="forbid")

    work_item_id: str
    run_id: str
    env_slug: str
    env_version: int
    env_hash: str
    model: str
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    max_tool_calls: int = 16
    # The run's overrides of the env's budgets (the actor resolves them with the env's).
    budgets: Budgets | None = None
    policy_version: int = 0
    items: list[RolloutItem]
    # Carried so the events an actor emits join the run's trace.
    trace_id: str
    correlation_id: str
    causation_id: str
    # Queued again by a redelivered fan-out: an earlier queue of the same item may have been
    # generated already, past the work stream's dedup window (which drops a re-queue only
    # within it), so the actor reads the log for its rollouts even on a first delivery.
    requeued: bool = False
