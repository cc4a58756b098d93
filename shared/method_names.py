"""The built-in training methods' names, for code that must not import the trainers.

`rollout --help` lists them. The table itself (titles, configs, trainers, and any method
registered later) is rollout.shared.learning.methods, which checks that it starts out with
exactly these, in this order.
"""

from __future__ import annotations

from typing import Any

# In the table's order: the offline methods first, then the online ones.
METHOD_NAMES: tuple[str, ...] = ("sft", "dpo", "kto", "rm", "grpo", "ppo", "opd")
ONLINE_METHODS: tuple[str, ...] = ("grpo", "ppo", "opd")

# Method names that select another method's model with one setting fixed (`ipo` is DPO's IPO).
METHOD_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {"ipo": ("dpo", {"loss_type": "ipo"})}


def method_names(*, online: bool | None = None) -> tuple[str, ...]:
    """The built-in methods' names in table order (only the online or offline ones when asked)."""
    return tuple(n for n in METHOD_NAMES if online is None or (n in ONLINE_METHODS) == online)
