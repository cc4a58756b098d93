"""An env whose episodes cannot be replayed after a long note kills the host
(unreplayable_plugin.py): such an episode ends errored."""

from rollout import Environment, Task, plugin_config

env = Environment(
    slug="unreplayable",
    template="plugin",
    config=plugin_config("unreplayable_plugin:make_env", {}),
    tasks=[Task(instruction="Keep the note ok.", hidden_ground_truth={"note": "ok"})],
)
