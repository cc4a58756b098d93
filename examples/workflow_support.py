"""Workflow template, built with the SDK helpers: look up orders, refund the right amount.

Train and test orders come from one family (a customer asks for a full refund of an order) but
from disjoint pools: other customers, order numbers, amounts and phrasings.
"""

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

CUSTOMERS = {
    "train": ["Alice", "Bob", "Chen", "Dana", "Eve", "Farid", "Gita", "Hugo"],
    "test": ["Ines", "Jamal", "Keiko"],
}
# O-1001.. train orders, O-9001.. test orders.
FIRST_NUMBER = {"train": 1001, "test": 9001}
COUNT = {"train": 24, "test": 8}
PHRASING = {
    "train": "{customer} wants a full refund for order {id}.",
    "test": "Please give back everything paid on {id}; the customer is {customer}.",
}
rng = random.Random(5)
# Every order a different amount (multiples of 5), so no amount occurs in both splits.
AMOUNTS = iter(5 * a for a in rng.sample(range(2, 200), COUNT["train"] + COUNT["test"]))
ORDERS = [
    {
        "id": f"O-{FIRST_NUMBER[split] + k}",
        "customer": CUSTOMERS[split][(k * 3) % len(CUSTOMERS[split])],
        "amount": next(AMOUNTS),
        "status": "shipped",
        "split": split,
    }
    for split in ("train", "test")
    for k in range(COUNT[split])
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
        fixtures={"orders": [{k: v for k, v in o.items() if k != "split"} for o in ORDERS]},
        initial_mutable_state={"refunds": []},
    ),
    tasks=[
        Task(
            instruction=PHRASING[o["split"]].format(**o),
            hidden_ground_truth={"refunds": [{"order_id": o["id"], "amount": o["amount"]}]},
            split=o["split"],
            id=o["id"],
        )
        for o in ORDERS
    ],
    verifier=verifier_config(
        primitive("looked_up", "tool_was_called", tool="get_order", weight=1),
        primitive("refunded", "state_match", weight=3),
        primitive("lookup_first", "tool_call_order", tools=["get_order", "refund"], weight=1),
        primitive("no_errors", "no_tool_errors", weight=1),
    ),
)
