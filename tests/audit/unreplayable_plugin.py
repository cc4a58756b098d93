"""A plugin that draws a fresh ticket number at each reset and whose note tool dies on a long
note (as a C extension with a fixed buffer would). The platform replays an episode whose step
killed its host on a fresh one, but this episode cannot be replayed (the ticket differs), so it
ends errored: a model that writes a long note escapes its verdict."""

import os
import secrets
from typing import Any


class Unreplayable:
    """Read the ticket, keep a note on it. The task wants the note "ok"."""

    def __init__(self) -> None:
        self.ticket = ""
        self.note = ""

    def tools(self) -> list[dict[str, Any]]:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        return [
            {"name": "read_ticket", "description": "The ticket's number.",
             "parameters": {"type": "object", "properties": {}}},
            {"name": "keep_note", "description": "Keep a note.", "parameters": schema},
        ]  # fmt: skip

    def reset(self, task: dict[str, Any]) -> None:
        self.ticket, self.note = secrets.token_hex(4), ""

    def step(self, name: str, arguments: dict[str, Any]) -> Any:
        if name == "read_ticket":
            return {"ticket": self.ticket}
        self.note = str(arguments.get("text", ""))
        if len(self.note) > 1000:
            os._exit(1)  # the fixed buffer overflows
        return {"kept": len(self.note)}

    def state(self) -> dict[str, Any]:
        return {"note": self.note}


def make_env(options: dict[str, Any]) -> Unreplayable:
    """The entrypoint."""
    return Unreplayable()
