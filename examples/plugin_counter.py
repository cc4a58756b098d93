"""Plugin environment: the env is Python code behind a `module:function` entrypoint."""

from rollout import Environment, Task, plugin_config

PHRASINGS = [
    "Increment the counter until it reaches {n}.",
    "Bring the counter to {n}.",
    "The counter should read {n}; increment it.",
]

env = Environment(
    slug="counter-plugin",
    name="Counter (plugin)",
    template="plugin",
    config=plugin_config("example_plugins.counter:make_env", {"step": 1}),
    tasks=[
        Task(
            instruction=phrasing.format(n=n),
            input={"target": n},
            hidden_ground_truth={"value": n},
            split="test" if (n + k) % 4 == 3 else "train",
        )
        for k, phrasing in enumerate(PHRASINGS)
        for n in range(2, 10)
    ],
)
