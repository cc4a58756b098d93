"""A plugin whose state() takes its process down on a note it cannot hold (as a C extension
with a fixed buffer would): a model that writes such a note escapes its verdict, since an
episode whose final state cannot be taken is errored."""

import os
from typing import Any


class FragileState:
    """One tool: keep a note. The task wants the note "ok"."""

    def __init__(self) -> None:
        self.note = ""

    def tools(self) -> list[dict[str, Any]]:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        return [{"name": "keep_note", "description": "Keep a note.", "parameters": schema}]

    def reset(self, task: dict[str, Any]) -> None:
        self.note = ""

    def step(self, name: str, arguments: dict[str, Any]) -> Any:
        self.note = str(arguments.get("text", ""))
        return {"kept": len(self.note)}

    def state(self) -> dict[str, Any]:
        if len(self.note) > 1000:
            os._exit(1)  # the fixed buffer overflows
        return {"note": self.note}


def make_env(options: dict[str, Any]) -> FragileState:
    """The entrypoint."""
    return FragileState()
