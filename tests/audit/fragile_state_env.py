"""An env a long note takes down at the end of the episode (fragile_state_plugin.py)."""

from rollout import Environment, Task, plugin_config

env = Environment(
    slug="fragile-state",
    template="plugin",
    config=plugin_config("fragile_state_plugin:make_env", {}),
    tasks=[Task(instruction="Keep the note ok.", hidden_ground_truth={"note": "ok"})],
)
