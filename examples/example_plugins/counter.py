"""A Python plugin environment: `plugin_counter.py` names it as example_plugins.counter:make_env."""

from typing import Any


class CounterEnv:
    """Count up to a target: the smallest useful reset/step environment."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.step_size = int(options.get("step", 1))
        self.value = 0
        self.target = 0

    def tools(self) -> list[dict[str, Any]]:
        return [
            {
                "name": "increment",
                "description": "Add the step to the counter.",
                "parameters": {"type": "object", "properties": {}},
            },
            {
                "name": "read",
                "description": "Read the counter and the target.",
                "parameters": {"type": "object", "properties": {}},
            },
        ]

    def reset(self, task: dict[str, Any]) -> None:
        self.value = 0
        self.target = int(task["input"].get("target", 3))

    def step(self, name: str, arguments: dict[str, Any]) -> Any:
        if name == "increment":
            if self.value >= self.target:
                raise ValueError("already at the target")
            self.value += self.step_size
            return {"value": self.value}
        if name == "read":
            return {"value": self.value, "target": self.target}
        raise ValueError(f"no tool {name}")

    def state(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target}


def make_env(options: dict[str, Any]) -> CounterEnv:
    """The entrypoint: `example_plugins.counter:make_env`."""
    return CounterEnv(options)
