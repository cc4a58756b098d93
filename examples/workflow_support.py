"""Workflow template, built with the SDK helpers: look up orders, refund the right amount."""

import random

from rollout import (
    Environment,
    Task,
    action_tool,
    lookup_tool,
    mock_tool,
    primitive,
    verifier_config,
    workflow_config,
)

CUSTOMERS = ["Alice", "Bob", "Chen", "Dana", "Eve", "Farid", "Gita", "Hugo", "Iris", "Jon"]
rng = random.Random(5)
# 32 generated orders; every fourth is a test task: train and test from one distribution.
ORDERS = [
    {
        "id": f"O-{i}",
        "customer": CUSTOMERS[(i * 3) % len(CUSTOMERS)],
        "amount": 5 * rng.randint(2, 60),
        "status": "shipped",
    }
    for i in range(1, 33)
]

env = Environment(
    slug="support-refunds",
    name="Support refunds",
    template="workflow",
    description="Look up an order, then refund its full amount.",
    config=workflow_config(
        tools=[
            lookup_tool(
                "get_order",
                from_array="orders",
                match_field="id",
                description="Read an order by id.",
                params_schema={"id": "string"},
            ),
            action_tool(
                "refund",
                state_array="refunds",
                description="Issue a refund.",
                params_schema={"order_id": "string", "amount": "number"},
            ),
            mock_tool(
                "notify_customer",
                response={"sent": True, "to": "${args.customer}"},
                description="Email the customer.",
                params_schema={"customer": "string"},
            ),
        ],
        fixtures={"orders": ORDERS},
        initial_mutable_state={"refunds": []},
    ),
    tasks=[
        Task(
            instruction=f"{o['customer']} wants a full refund for order {o['id']}.",
            hidden_ground_truth={"refunds": [{"order_id": o["id"], "amount": o["amount"]}]},
            split="test" if i % 4 == 3 else "train",
            id=o["id"],
        )
        for i, o in enumerate(ORDERS)
    ],
    verifier=verifier_config(
        primitive("looked_up", "tool_was_called", tool="get_order", weight=1),
        primitive("refunded", "state_match", weight=3),
        primitive("lookup_first", "tool_call_order", tools=["get_order", "refund"], weight=1),
        primitive("no_errors", "no_tool_errors", weight=1),
    ),
)
