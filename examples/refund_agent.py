# refund_agent.py
from rollout import Environment, Task

env = Environment(
    slug="refund-agent",
    name="Refund Agent",
    template="workflow",
    description="Customer-support refund workflow",
    config={
        "tools": [
            {
                "name": "lookup_order",
                "kind": "lookup",
                "fixturePath": "orders.${args.order_id}",
            },
            {
                "name": "refund",
                "kind": "action",
                "appendTo": "refunds",
                "value": {
                    "order_id": "${args.order_id}",
                    "amount": "${args.amount}",
                },
            },
        ],
        "fixtures": {
            "orders": {
                "O-1": {"customer": "Alice", "amount": 100, "status": "shipped"},
            },
        },
        "initialMutableState": {"refunds": []},
    },
    tasks=[
        Task(
            instruction="Refund order O-1 for $100 for Alice",
            hidden_ground_truth={
                "refunds": [{"order_id": "O-1", "amount": 100.0}],
            },
        ),
    ],
)
