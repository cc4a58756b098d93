# ruff: noqa
# fmt: off
# Verbatim from the seed README (the "Template helpers" section).
from rollout import (
    Environment, Task,
    lookup_tool, action_tool, mock_tool,
    custom_tool, custom_config,
    workflow_config, code_editing_config,
    browser_page, browser_config,
    primitive, verifier_config,
)

env = Environment(
    slug="refund-agent",
    name="Refund Agent",
    template="workflow",
    config=workflow_config(
        tools=[
            lookup_tool("get_order", from_array="orders", match_field="id",
                        description="Read an order.", params_schema={"id": "string"}),
            action_tool("refund", state_array="refunds",
                        description="Issue a refund.",
                        params_schema={"order_id": "string", "amount": "number"}),
        ],
        fixtures={"orders": [{"id": "O-1", "customer": "Alice", "amount": 100}]},
        initial_mutable_state={"refunds": []},
    ),
    tasks=[
        Task(instruction="Refund order O-1 for $100",
             hidden_ground_truth={"refunds": [{"order_id": "O-1", "amount": 100}]}),
    ],
)

env.verifier = verifier_config(
    primitive("called_lookup", "tool_was_called", tool="get_order", weight=1),
    primitive("refunds_count", "state_match",
              expected={"refunds.length": 1}, weight=2),
    primitive("no_errors", "no_tool_errors", weight=1),
)
