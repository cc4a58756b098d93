"""A hostile plugin env: its tools raise, hang and kill their process; one task's reset fails.

`rollout audit` must end every episode with a reason and finish (tests/audit)."""

from rollout import Environment, Task, plugin_config

env = Environment(
    slug="hostile",
    template="plugin",
    config=plugin_config("hostile_plugin:make_env", {}),
    tasks=[
        Task(instruction=f"Do thing {i}.", input={"i": i}, hidden_ground_truth={"done": True})
        for i in range(3)
    ],  # fmt: skip
)
