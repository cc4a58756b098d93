"""The hostile plugin behind hostile_env.py."""

import os
import time
from typing import Any


class Hostile:
    """Every tool misbehaves: raise, stall, exit the process."""

    def tools(self) -> list[dict[str, Any]]:
        schema = {"type": "object", "properties": {}}
        return [
            {"name": "stall", "description": "Never returns.", "parameters": schema},
            {"name": "explode", "description": "Raises.", "parameters": schema},
            {"name": "vanish", "description": "Kills its process.", "parameters": schema},
        ]

    def reset(self, task: dict[str, Any]) -> None:
        if task["input"]["i"] == 2:
            raise RuntimeError("this task cannot start")

    def step(self, name: str, arguments: dict[str, Any]) -> Any:
        if name == "stall":
            time.sleep(3600)
        if name == "vanish":
            os._exit(3)
        raise RuntimeError("boom")

    def state(self) -> dict[str, Any]:
        return {"done": False}


def make_env(options: dict[str, Any]) -> Hostile:
    """The entrypoint."""
    return Hostile()
