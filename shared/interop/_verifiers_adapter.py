"""Runs inside a plugin host's sandbox: the plugin-protocol face of a verifiers (v1) taskset.

Shipped as a bundled source and imports nothing of rollout. The factory loads the taskset by
its verifiers id (with verifiers' own loader); `load` returns its tasks as rows (the prompt
text and the task's wire data), and `score` rebuilds one task from its data and runs the
task's own `@vf.reward` functions on an offline trace of the reply.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

_MARK = "verifiers: "

# What a reward's own code raises on a reply it cannot read (`int("five")`, a missing key, a
# reply too long to convert): the reply's doing, not the machine's. Anything else (a timeout,
# a connection, a judge's provider, verifiers' own typed errors) may be the infrastructure's.
_CODE_ERRORS = (
    ArithmeticError,
    AssertionError,
    AttributeError,
    LookupError,
    NameError,
    RecursionError,
    TypeError,
    ValueError,
    re.error,
)


def _root_cause(exc: BaseException) -> BaseException:
    """The exception at the bottom of `exc`'s `raise ... from` chain (verifiers wraps a reward's
    own error in the TaskError of its scoring boundary)."""
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


try:  # imported with the module, under the host's start deadline (it is a heavy import)
    _VF: Any = importlib.import_module("verifiers.v1")
except ImportError as _exc:
    _VF, _IMPORT_ERROR = None, str(_exc)


class _Env:
    def __init__(self, taskset: Any, vf: Any) -> None:
        self.taskset = taskset
        self.vf = vf
        self.task_cls = type(taskset).task_type()
        self.data_cls = self.task_cls.data_type()

    def tools(self) -> list[dict[str, Any]]:
        return [
            {"name": "load", "description": "the taskset's tasks", "parameters": {}},
            {"name": "score", "description": "the task's rewards for a reply", "parameters": {}},
        ]

    def reset(self, task: dict[str, Any]) -> None:
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def step(self, name: str, arguments: dict[str, Any]) -> Any:
        if name == "load":
            return self._load(int(arguments.get("limit") or 10_000))
        if name == "score":
            return self._score(arguments)
        raise ValueError(f"{_MARK}unknown operation {name!r}")

    def _load(self, limit: int) -> dict[str, Any]:
        rows = []
        for task in self.taskset:
            data = task.data
            rows.append(
                {
                    "prompt": data.prompt_text,
                    "system_prompt": data.system_prompt,
                    "id": data.id,
                    "name": data.name,
                    "data": data.model_dump(mode="json", exclude_defaults=True),
                }
            )
            if len(rows) > limit:
                break
        return {"rows": rows}

    async def _score(self, arguments: dict[str, Any]) -> dict[str, Any]:
        vf = self.vf
        data = self.data_cls.model_validate(arguments.get("data") or {})
        task = self.task_cls(data, self.taskset.config.task)
        trace = vf.Trace(
            task=vf.TraceTask(type=self.task_cls.__name__, data=data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig(), name="rollout", trainable=False),
            root_reply=str(arguments.get("reply") or ""),
        )
        try:
            await task.score(trace)
        except Exception as exc:  # noqa: BLE001 - the caller decides whose fault it was
            cause = _root_cause(exc)
            return {
                "raised": f"{type(exc).__name__}: {exc}"[:500],
                "codeError": isinstance(cause, _CODE_ERRORS),
            }
        rewards = {
            name: None if r is None else {"score": r.score, "weight": r.weight}
            for name, r in trace.rewards.items()
        }
        return {"reward": float(trace.reward), "rewards": rewards}


def factory(options: dict[str, Any]) -> _Env:
    """Load options['taskset'] (a verifiers taskset id) with options['options']."""
    vf = _VF
    if vf is None:
        raise ValueError(f"{_MARK}the verifiers package is not importable here: {_IMPORT_ERROR}")
    taskset_id = str(options["taskset"])
    try:
        config = vf.taskset_config_type(taskset_id)(
            id=taskset_id, **dict(options.get("options") or {})
        )
        taskset = vf.load_taskset(config)
    except ImportError as exc:
        raise ValueError(f"{_MARK}taskset {taskset_id!r} could not be imported: {exc}") from None
    except (TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"{_MARK}taskset {taskset_id!r} could not be loaded: {exc}") from None
    return _Env(taskset, vf)
