"""A one-tool workflow env small enough for a few-step tiny model: submit the code named."""

from rollout import Environment, Task, action_tool, workflow_config

CODES = [f"K{n}" for n in range(1, 17)]

env = Environment(
    slug="submit-codes",
    name="Submit codes",
    template="workflow",
    description="Submit exactly the code the user names.",
    config=workflow_config(
        tools=[
            action_tool(
                "submit",
                state_array="submitted",
                description="Submit a code.",
                params_schema={"code": "string"},
            )
        ],
        initial_mutable_state={"submitted": []},
    ),
    tasks=[
        Task(
            instruction=f"Submit the code {code}.",
            hidden_ground_truth={"submitted": [{"code": code}]},
            # Every fourth code is held out: train and test come from the same distribution.
            split="test" if i % 4 == 3 else "train",
        )
        for i, code in enumerate(CODES)
    ],
)
