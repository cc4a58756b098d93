"""Workflow template, a branch on what a lookup returns: refund, notify, or both.

The desk's rule (in the env's description and the tools'): look the order up; a delivered
order is refunded in full; a lost one is refunded in full and its customer notified; one still
in transit is not refunded, its customer is notified. The agent must read the status to know
which calls to make, so copying one fixed plan fails two tasks in three. Train, validation and
test orders come from disjoint pools (customers, order numbers, amounts, phrasings); the three
statuses are the env's labels. Recipes are tuned on validation; test is only reported.
"""

import random

from rollout import (
    Environment,
    Task,
    action_tool,
    lookup_tool,
    primitive,
    verifier_config,
    workflow_config,
)

CUSTOMERS = {
    "train": ["Ada", "Bram", "Cleo", "Dev", "Esme", "Finn", "Gus", "Hana", "Ilse"],
    "validation": ["Jude", "Kai", "Lior"],
    "test": ["Mina", "Noor", "Otto", "Pia", "Rafe", "Sage"],
}
FIRST_NUMBER = {"train": 3001, "validation": 4001, "test": 7001}
COUNT = {"train": 36, "validation": 12, "test": 18}
STATUSES = ["delivered", "lost", "in_transit"]
PHRASINGS = {
    "train": [
        "{customer} wrote in about order {id}. Handle it by the desk's rule.",
        "Please deal with {customer}'s message about {id}.",
        "Order {id} ({customer}) came up in the returns queue; resolve it.",
    ],
    "validation": [
        "Resolve the ticket {customer} opened for {id}.",
        "{customer} is asking what happens with {id}; act on it.",
    ],
    "test": [
        "A note from {customer} concerns order {id}: take care of it.",
        "Work through {id} for {customer} as the rule says.",
    ],
}
SPLITS = ("train", "validation", "test")
rng = random.Random(23)
AMOUNTS = iter(5 * a for a in rng.sample(range(3, 500), sum(COUNT.values())))
ORDERS = [
    {
        "id": f"Q-{FIRST_NUMBER[split] + k}",
        "customer": CUSTOMERS[split][(k * 5) % len(CUSTOMERS[split])],
        "amount": next(AMOUNTS),
        # Every status equally often, in an order a fixed pattern cannot follow.
        "status": STATUSES[(k + k // 3) % 3],
        "split": split,
        "phrasing": PHRASINGS[split][k % len(PHRASINGS[split])],
    }
    for split in SPLITS
    for k in range(COUNT[split])
]


def truth(order: dict) -> dict:
    """What the desk's rule does with `order`: its refunds and notifications."""
    refund = order["status"] in ("delivered", "lost")
    notify = order["status"] in ("lost", "in_transit")
    return {
        "refunds": [{"order_id": order["id"], "amount": order["amount"]}] if refund else [],
        "notices": [{"customer": order["customer"], "order_id": order["id"]}] if notify else [],
    }


env = Environment(
    slug="returns-desk",
    name="Returns desk",
    template="workflow",
    description=(
        "Look the order up. Delivered: refund its full amount. Lost: refund its full amount "
        "and notify the customer. In transit: notify the customer, no refund."
    ),
    budgets={"max_turn_tokens": 80},
    config=workflow_config(
        tools=[
            lookup_tool(
                "get_order",
                from_array="orders",
                match_field="id",
                description="Read an order: its customer, amount and status.",
                params_schema={"id": "string"},
            ),
            action_tool(
                "refund",
                state_array="refunds",
                description="Refund an order (delivered or lost orders only).",
                params_schema={"order_id": "string", "amount": "number"},
            ),
            action_tool(
                "notify_customer",
                state_array="notices",
                description="Tell a customer about their order (lost or in transit).",
                params_schema={"customer": "string", "order_id": "string"},
            ),
        ],
        fixtures={
            "orders": [{k: o[k] for k in ("id", "customer", "amount", "status")} for o in ORDERS]
        },
        initial_mutable_state={"refunds": [], "notices": []},
    ),
    tasks=[
        Task(
            instruction=o["phrasing"].format(**o),
            hidden_ground_truth=truth(o),
            split=o["split"],
            id=o["id"],
        )
        for o in ORDERS
    ],
    verifier=verifier_config(
        # All or nothing: credit per path paid an idle agent for the lists it left untouched
        # (0.4), and a blind notice scored 0.8 on in-transit orders without a lookup.
        primitive("handled", "state_match", weight=3, all_or_nothing=True),
        primitive("looked_up", "tool_was_called", tool="get_order", weight=2),
        primitive("no_errors", "no_tool_errors", weight=1),
    ),
)
