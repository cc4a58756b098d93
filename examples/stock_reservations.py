"""Workflow template, three tool calls: look an order up, check its item's stock, reserve it.

The reservation needs facts from both lookups (the SKU and quantity from the order, the
warehouse from the stock check), so an agent cannot act before it has read both. Train,
validation and test orders come from disjoint pools: other customers, order numbers, SKUs,
quantities and phrasings. Recipes are tuned on validation; test is only reported.
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
    "train": ["Amara", "Boris", "Clara", "Dmitri", "Elif", "Femi", "Greta", "Hassan"],
    "validation": ["Ivo", "Jana", "Kofi", "Lucia"],
    "test": ["Mira", "Nils", "Olu", "Paz", "Quinn", "Ravi"],
}
FIRST_NUMBER = {"train": 2001, "validation": 6001, "test": 8001}
COUNT = {"train": 32, "validation": 8, "test": 16}
# SKU families per split: no SKU (or its number) occurs in two splits.
SKU_PREFIX = {"train": "TR", "validation": "VA", "test": "TE"}
# The warehouses are the env's labels: every split ships from all four.
WAREHOUSES = ["north", "south", "east", "west"]
PHRASINGS = {
    "train": [
        "Reserve the stock for order {id} ({customer}).",
        "{customer} placed order {id}; hold its items in a warehouse.",
        "Please set aside inventory for {id}, the order from {customer}.",
        "Order {id} by {customer} needs its units reserved.",
    ],
    "validation": [
        "Book stock against order {id} for {customer}.",
        "{customer} is waiting on {id}: put its goods on hold.",
    ],
    "test": [
        "Could you allocate warehouse stock to {id}? It is {customer}'s order.",
        "Make sure the items of order {id} are held for {customer}.",
    ],
}
SPLITS = ("train", "validation", "test")
rng = random.Random(11)
SKU_NUMBERS = iter(rng.sample(range(100, 1000), sum(COUNT.values())))
QUANTITIES = {
    "train": [1, 2, 3, 4],
    "validation": [5, 6],
    "test": [7, 8, 9],
}
ORDERS = []
for split in SPLITS:
    for k in range(COUNT[split]):
        ORDERS.append(
            {
                "id": f"R-{FIRST_NUMBER[split] + k}",
                "customer": CUSTOMERS[split][(k * 3) % len(CUSTOMERS[split])],
                "sku": f"{SKU_PREFIX[split]}-{next(SKU_NUMBERS)}",
                "quantity": QUANTITIES[split][k % len(QUANTITIES[split])],
                "warehouse": WAREHOUSES[(k * 7 + len(split)) % len(WAREHOUSES)],
                "split": split,
                "phrasing": PHRASINGS[split][k % len(PHRASINGS[split])],
            }
        )

env = Environment(
    slug="stock-reservations",
    name="Stock reservations",
    template="workflow",
    description="Look up an order, check where its item is in stock, then reserve it there.",
    # The longest right turn, the reserve call with its four arguments, is about 58 tokens.
    budgets={"max_turn_tokens": 96},
    config=workflow_config(
        tools=[
            lookup_tool(
                "get_order",
                from_array="orders",
                match_field="id",
                description="Read an order by id: its sku and quantity.",
                params_schema={"id": "string"},
            ),
            lookup_tool(
                "check_stock",
                from_array="stock",
                match_field="sku",
                description="Where a sku is in stock.",
                params_schema={"sku": "string"},
            ),
            action_tool(
                "reserve",
                state_array="reservations",
                description="Reserve a quantity of a sku in a warehouse for an order.",
                params_schema={
                    "order_id": "string",
                    "sku": "string",
                    "quantity": "number",
                    "warehouse": "string",
                },
            ),
        ],
        fixtures={
            "orders": [{k: o[k] for k in ("id", "customer", "sku", "quantity")} for o in ORDERS],
            "stock": [
                {"sku": o["sku"], "warehouse": o["warehouse"], "available": o["quantity"] + 10}
                for o in ORDERS
            ],
        },
        initial_mutable_state={"reservations": []},
    ),
    tasks=[
        Task(
            instruction=o["phrasing"].format(**o),
            hidden_ground_truth={
                "reservations": [
                    {
                        "order_id": o["id"],
                        "sku": o["sku"],
                        "quantity": o["quantity"],
                        "warehouse": o["warehouse"],
                    }
                ]
            },
            split=o["split"],
            id=o["id"],
        )
        for o in ORDERS
    ],
    verifier=verifier_config(
        primitive("reserved", "state_match", weight=3),
        primitive(
            "read_first", "tool_call_order", tools=["get_order", "check_stock", "reserve"], weight=1
        ),
        primitive("no_errors", "no_tool_errors", weight=1),
    ),
)
