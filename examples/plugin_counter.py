"""Plugin environment: the env is Python code behind a `module:function` entrypoint."""

from rollout import Environment, Task, plugin_config

env = Environment(
    slug="counter-plugin",
    name="Counter (plugin)",
    template="plugin",
    config=plugin_config("example_plugins.counter:make_env", {"step": 1}),
    tasks=[
        Task(
            instruction=f"Increment the counter until it reaches {n}.",
            input={"target": n},
            hidden_ground_truth={"value": n},
            split="train" if n <= 5 else "test",
        )
        for n in range(2, 9)
    ],
)
