# The README's JSONL example: the refund env, then tasks loaded from a file beside it.
from rollout import Environment, Task

env = Environment(
    slug="refund-agent-jsonl",
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
                "O-2": {"customer": "Bob", "amount": 40, "status": "shipped"},
            },
        },
        "initialMutableState": {"refunds": []},
    },
)

env.tasks = Task.from_jsonl("tasks.jsonl")
