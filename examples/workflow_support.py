"""Workflow template, built with the SDK helpers: look up orders, refund the right amount.

Train, validation and test orders come from one family (a customer asks for a full refund of an
order) but from disjoint pools: other customers, order numbers, amounts and phrasings. Recipes
are tuned on validation; test is only reported.
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
    "validation": ["Lena", "Mateo", "Nadia", "Oscar"],
    "test": ["Ines", "Jamal", "Keiko", "Priya", "Quentin", "Rosa"],
}
# O-1001.. train orders, O-5001.. validation orders, O-9001.. test orders.
FIRST_NUMBER = {"train": 1001, "validation": 5001, "test": 9001}
COUNT = {"train": 24, "validation": 8, "test": 16}
# Several phrasings per split, none shared across splits (no 6-word span either): a model has
# to read the order id out of a request it has not seen worded that way.
PHRASINGS = {
    "train": [
        "{customer} wants a full refund for order {id}.",
        "Refund order {id} in full, please. It belongs to {customer}.",
        "{customer} returned everything from {id}; pay it all back.",
        "Customer {customer} asks for their money back on order {id}.",
    ],
    "validation": [
        "Order {id} needs a complete refund ({customer} asked).",
        "{customer} would like order {id} refunded entirely.",
    ],
    "test": [
        "Please give back everything paid on {id}; the customer is {customer}.",
        "{customer} is owed the whole amount of {id}. Process that refund.",
    ],
}
SPLITS = ("train", "validation", "test")
rng = random.Random(5)
# Every order a different amount (multiples of 5), so no amount occurs in two splits.
AMOUNTS = iter(5 * a for a in rng.sample(range(2, 400), sum(COUNT.values())))
ORDERS = [
    {
        "id": f"O-{FIRST_NUMBER[split] + k}",
        "customer": CUSTOMERS[split][(k * 3) % len(CUSTOMERS[split])],
        "amount": next(AMOUNTS),
        "status": "shipped",
        "split": split,
        "phrasing": PHRASINGS[split][k % len(PHRASINGS[split])],
    }
    for split in SPLITS
    for k in range(COUNT[split])
]

env = Environment(
    slug="support-refunds",
    name="Support refunds",
    template="workflow",
    description="Look up an order, then refund its full amount.",
    # The longest right turn, the refund call, is about 41 tokens.
    budgets={"max_turn_tokens": 64},
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
        fixtures={
            "orders": [
                {k: v for k, v in o.items() if k not in ("split", "phrasing")} for o in ORDERS
            ]
        },
        initial_mutable_state={"refunds": []},
    ),
    tasks=[
        Task(
            instruction=o["phrasing"].format(**o),
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
