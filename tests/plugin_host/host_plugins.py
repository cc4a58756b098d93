"""Plugin sources the host tests push into specs (each a module's text)."""

from __future__ import annotations

import textwrap
from typing import Any

# The step deadline of the tests' pool (conftest.pool).
STEP_TIMEOUT_S = 2.0

COUNTER = textwrap.dedent(
    """
    import asyncio, ctypes, os, sys, time

    VERSION = "v1"
    NAP_S = 0.5


    class Env:
        def __init__(self, options):
            self.options = options
            self.calls = 0
            self.poisoned = None

        def tools(self):
            return [
                {"name": "go", "description": "Do the task's thing.",
                 "parameters": {"type": "object", "properties": {"how": {"type": "string"}}}},
                {"name": "slow", "description": "Async step.",
                 "parameters": {"type": "object", "properties": {"how": {"type": "string"}}}},
            ]

        def reset(self, task):
            self.mode = task["input"].get("mode", "ok")
            self.nap = task["input"].get("nap", NAP_S)
            if self.mode == "hang_reset":
                while True:
                    pass

        def step(self, name, arguments):
            self.calls += 1
            if name == "slow":
                return self._slow(arguments.get("how"))
            # What a model's arguments can make a buggy tool do.
            how = arguments.get("how")
            if how == "exit":
                os._exit(3)
            if how == "sys_exit":
                sys.exit("bye")
            if how in ("poison_exit", "poison_hang"):  # state() cannot cope with it later
                self.poisoned = how
            if self.mode == "poison":
                self.poisoned = "poison_exit"
            if how == "hang":
                while True:
                    pass
            if how == "stubborn_hang":  # keeps even the worker's alarm out
                while True:
                    try:
                        time.sleep(60)
                    except BaseException:
                        pass
            if self.mode == "hang":
                while True:
                    pass
            if self.mode == "nap":
                time.sleep(self.nap)
            if self.mode == "exit":
                os._exit(3)
            if self.mode == "exit2" and self.calls == 2:
                os._exit(3)
            if self.mode == "rand":
                return {"version": VERSION, "calls": self.calls, "r": os.urandom(8).hex()}
            if self.mode == "segv":
                ctypes.string_at(0)
            if self.mode == "raise":
                raise KeyError("no such thing")
            if self.mode == "alloc":
                return len(bytearray(4_000_000_000))
            if self.mode == "huge":
                return "x" * 3_000_000
            return {"version": VERSION, "calls": self.calls}

        async def _slow(self, how):
            await asyncio.sleep(3600 if how == "hang" else 0.01)
            return {"async": True, "calls": self.calls}

        def state(self):
            if self.poisoned == "poison_exit" or self.mode == "state_exit":
                os._exit(3)
            if self.poisoned == "poison_hang":
                while True:
                    pass
            return {"calls": self.calls, "mode": self.mode}


    def make_env(options):
        return Env(options)
    """
)


def spec(
    source: str = COUNTER,
    *,
    module: str = "hostplug",
    modes: tuple[str, ...] = ("ok",),
    slug: str = "hostplug",
) -> dict[str, Any]:
    """A plugin env whose module is bundled in config.sources, one task per mode."""
    return {
        "slug": slug,
        "template": "plugin",
        "config": {"entrypoint": f"{module}:make_env", "sources": {f"{module}.py": source}},
        "tasks": [
            {"instruction": f"mode {m}", "input": {"mode": m}, "hiddenGroundTruth": {}}
            for m in modes
        ],
        "verifier": {"primitives": [{"name": "called", "type": "tool_was_called", "tool": "go"}]},
    }


# Imports slowly, as a plugin with heavy dependencies does: a cold host takes IMPORT_S to start.
IMPORT_S = 0.6
SLOW_IMPORT = COUNTER.replace(
    "import asyncio,", f"import time\ntime.sleep({IMPORT_S})\nimport asyncio,"
)
