"""Deliberately weak refund envs, one per class of finding `rollout audit` reports.

The tasks are the same; only the verifiers differ:
- weak-echo: `contains_terms` whose terms appear in the instruction (an echo passes);
- weak-called: `tool_was_called` without argument checks (any refund call passes);
- weak-weights: the outcome check weighs 1, a check that doing nothing passes weighs 4
  (an episode that does nothing earns 0.8 of the reward).
"""

from rollout import Environment, Task, primitive, verifier_config

ORDERS = {f"O-{i}": {"customer": name, "amount": 10 * i} for i, name in
          enumerate(["Ana", "Ben", "Cy", "Dee"], start=1)}  # fmt: skip
CONFIG = {
    "tools": [
        {"name": "lookup_order", "kind": "lookup", "fixturePath": "orders.${args.order_id}"},
        {
            "name": "refund",
            "kind": "action",
            "appendTo": "refunds",
            "value": {"order_id": "${args.order_id}", "amount": "${args.amount}"},
        },
    ],
    "fixtures": {"orders": ORDERS},
    "initialMutableState": {"refunds": []},
}
TASKS = [
    Task(
        instruction=f"Refund order {order_id} in full for {o['customer']}.",
        input={"order_id": order_id},
        hidden_ground_truth={"refunds": [{"order_id": order_id, "amount": o["amount"]}]},
        split="train" if i < 2 else "test",
    )
    for i, (order_id, o) in enumerate(ORDERS.items())
]


def weak(slug: str, *primitives: dict) -> Environment:
    """The refund env with this verifier."""
    return Environment(slug=slug, template="workflow", config=CONFIG, tasks=TASKS,
                       verifier=verifier_config(*primitives))  # fmt: skip


echo = weak("weak-echo", primitive("mentions", "contains_terms", terms=["refund", "order"]))
called = weak("weak-called", primitive("refunded", "tool_was_called", tool="refund"))
weights = weak(
    "weak-weights",
    primitive("refunded", "state_match", weight=1),
    primitive("clean", "no_tool_errors", weight=4),
)
