"""The plugin host's worker: imports one plugin and serves its episodes over stdin/stdout.

It runs inside the sandbox (``python -I -c <this file>``) and imports nothing of rollout, so it
needs nothing of the service's files. Protocol: one JSON object per line each way (see
protocol.py). The plugin's own prints go to stderr; the protocol streams are private dups.
Episodes run one after another: every ``reset`` builds a fresh env object with the factory.

A step's failure on the model's arguments is a tool error, never the host's end: whatever the
plugin raises (SystemExit too) is answered as one, and a step still running at the soft
deadline (``step_timeout_s`` from ``load``, a little under the client's) is interrupted by an
alarm and answered as one, so the episode's env survives both. What no alarm can stop (code
that swallows it, a C call) is killed by the client at its own deadline.

The same functions serve the in-process baseline of benchmarks/engine.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import re
import resource
import signal
import sys
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

MAX_ENTRYPOINT_LEN = 260
ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,127}:[A-Za-z_][A-Za-z0-9_]{0,127}$")
PROTOCOL = ("tools", "reset", "step", "state")
SOURCES_DIR = "/tmp/rollout-plugin"
_OPS = frozenset(("load", "reset", "tools", "step", "state", "close"))  # and "batch"


class PluginError(ValueError):
    """An entrypoint that is malformed, does not import, or breaks the protocol."""


def check_entrypoint(value: object) -> str:
    """Validate the shape of a `module.path:function` entrypoint (no import)."""
    if not isinstance(value, str):
        raise PluginError(f"entrypoint must be a string, got {type(value).__name__}")
    if not value:
        raise PluginError("entrypoint must not be empty")
    if "\x00" in value:
        raise PluginError("entrypoint must not contain null bytes")
    if len(value) > MAX_ENTRYPOINT_LEN:
        raise PluginError(f"entrypoint must be <= {MAX_ENTRYPOINT_LEN} chars")
    if not ENTRYPOINT_RE.match(value) or ".." in value or value.split(":")[0].endswith("."):
        raise PluginError(
            f"entrypoint {value!r} must match 'module.path:function_name' "
            "(letters / digits / underscore / dot only)"
        )
    return value


def write_sources(sources: dict[str, str], folder: str) -> None:
    """Write bundled sources under folder (relative .py paths only, checked again here)."""
    for rel, text in sources.items():
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or pure.suffix != ".py":
            raise PluginError(f"config.sources[{rel!r}]: must be a relative .py path")
        target = os.path.join(folder, *pure.parts)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)


def add_after_stdlib(folder: str) -> None:
    """Put folder on sys.path after the standard library, so it can shadow none of it."""
    for i, entry in enumerate(sys.path):
        if "site-packages" in entry or "dist-packages" in entry:
            sys.path.insert(i, folder)
            break
    else:
        sys.path.append(folder)
    importlib.invalidate_caches()


def resolve_entrypoint(value: object) -> Callable[..., Any]:
    """Import the module and return the factory; every failure is a PluginError naming it."""
    spec = check_entrypoint(value)
    module_path, _, fn_name = spec.partition(":")
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise PluginError(f"module {module_path!r} could not be imported: {exc}") from None
    except BaseException as exc:  # user code failing at import time (even SystemExit): name it
        raise PluginError(
            f"module {module_path!r} raised {type(exc).__name__} on import: {exc}"
        ) from None
    if not hasattr(module, fn_name):
        raise PluginError(f"{spec!r}: module {module_path!r} has no attribute {fn_name!r}")
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise PluginError(f"{spec!r}: {fn_name!r} is not callable ({type(fn).__name__})")
    return fn


def make_env(factory: Callable[..., Any], entrypoint: str, options: dict[str, Any]) -> Any:
    """Call the factory and check the result implements the protocol."""
    try:
        env = factory(dict(options))
    except Exception as exc:
        raise PluginError(
            f"{entrypoint!r} raised {type(exc).__name__} when called: {exc}"
        ) from None
    missing = [m for m in PROTOCOL if not callable(getattr(env, m, None))]
    if missing:
        raise PluginError(
            f"{entrypoint!r} returned {type(env).__name__}, which lacks "
            f"{', '.join(missing)} (needs tools/reset/step/state)"
        )
    return env


def tool_dicts(env: Any) -> list[dict[str, Any]]:
    """The plugin's tools as validated dicts (PluginError when malformed)."""
    try:
        tools = env.tools()
    except Exception as exc:
        raise PluginError(f"tools() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(tools, list | tuple):
        raise PluginError(f"tools() must return a list, got {type(tools).__name__}")
    out = []
    for i, tool in enumerate(tools):
        if hasattr(tool, "model_dump"):
            tool = tool.model_dump()
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise PluginError(f"tools()[{i}] must be a dict with a string 'name'")
        params = tool.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise PluginError(f"tools()[{i}].parameters must be an object")
        out.append(
            {
                "name": tool["name"],
                "description": str(tool.get("description", "")),
                "parameters": json.loads(json.dumps(params, default=str)),
            }
        )
    return out


class _StepDeadline(BaseException):
    """Raised into a step by the alarm (a BaseException: `except Exception` cannot keep it)."""


# True only while a step runs: an alarm that fires just after one ends must not hit the worker.
_in_step = False


def _on_alarm(signum: int, frame: Any) -> None:
    if _in_step:
        raise _StepDeadline


class _Failure(Exception):
    """A reply with ok=false: kind is config (the env is broken), episode or tool."""

    def __init__(self, kind: str, message: str, error_type: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.error_type = error_type


class Worker:
    """One plugin's factory and the live env of each episode it serves (by ``ep``, default 0)."""

    def __init__(self) -> None:
        self.entrypoint = ""
        self.factory: Callable[..., Any] | None = None
        self.envs: dict[int, Any] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.max_result_bytes = 1_000_000
        self.step_timeout_s: float | None = None

    def _await(self, value: Any) -> Any:
        # One loop for the host's life: an async plugin may keep loop-bound objects across steps.
        if not inspect.isawaitable(value):
            return value
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        task = asyncio.ensure_future(value, loop=self.loop)
        try:
            return self.loop.run_until_complete(task)
        except BaseException:
            # Stopped from outside (the step's deadline): the task must not linger in the loop
            # and resume inside a later step.
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):  # its cancellation is all we want
                    self.loop.run_until_complete(task)
            raise

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Materialise the sources in the sandbox's own /tmp and import the entrypoint."""
        self.max_result_bytes = int(msg.get("max_result_bytes") or self.max_result_bytes)
        if msg.get("step_timeout_s"):
            self.step_timeout_s = float(msg["step_timeout_s"])
            signal.signal(signal.SIGALRM, _on_alarm)
        self.entrypoint = msg["entrypoint"]
        try:
            if msg.get("sources"):
                write_sources(msg["sources"], SOURCES_DIR)
                add_after_stdlib(SOURCES_DIR)
            self.factory = resolve_entrypoint(self.entrypoint)
        except PluginError as exc:
            raise _Failure("config", str(exc)) from None
        return {}

    def reset(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A fresh env for a new episode; its tools."""
        if self.factory is None:
            raise _Failure("config", "the plugin is not loaded")
        self.close(msg)
        try:
            env = make_env(self.factory, self.entrypoint, msg.get("options") or {})
        except PluginError as exc:
            raise _Failure("config", str(exc)) from None
        if msg.get("probe"):
            # Validation: the tools of a fresh env, without an episode.
            try:
                return {"tools": tool_dicts(env), "cpu_s": _cpu_seconds()}
            except PluginError as exc:
                raise _Failure("config", str(exc)) from None
            finally:
                self._close_env(env, quietly=True)
        try:
            self._await(env.reset(msg.get("task") or {}))
        except Exception as exc:
            raise _Failure("episode", f"reset() raised {type(exc).__name__}: {exc}") from None
        self.envs[_ep(msg)] = env
        try:
            tools = tool_dicts(env)
        except PluginError as exc:
            raise _Failure("config", str(exc)) from None
        return {"tools": tools, "cpu_s": _cpu_seconds()}

    def _live(self, msg: dict[str, Any]) -> Any:
        env = self.envs.get(_ep(msg))
        if env is None:
            raise _Failure("episode", "no episode: reset first")
        return env

    def tools(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The current env's tools."""
        try:
            return {"tools": tool_dicts(self._live(msg))}
        except PluginError as exc:
            raise _Failure("config", str(exc)) from None

    def step(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Run one tool; an exception or the step's deadline is a tool error (type, message)."""
        global _in_step
        env = self._live(msg)
        limit = self.step_timeout_s
        try:
            if limit:
                _in_step = True
                signal.setitimer(signal.ITIMER_REAL, limit)
            try:
                out = self._await(env.step(msg["name"], msg.get("arguments") or {}))
            finally:
                if limit:
                    _in_step = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except _StepDeadline:
            raise _Failure(
                "tool", f"did not finish within {limit:g}s (stopped)", "StepTimeout"
            ) from None
        except BaseException as exc:  # SystemExit too: the plugin failed on these arguments
            raise _Failure("tool", str(exc), type(exc).__name__) from None
        return {"output": out}

    def state(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The env's state() (an error marker if it fails, so scoring still happens)."""
        env = self._live(msg)
        try:
            state = self._await(env.state())
        except Exception as exc:
            return {"state": {"_stateError": f"{type(exc).__name__}: {exc}"}}
        if not isinstance(state, dict):
            return {
                "state": {"_stateError": f"state() returned {type(state).__name__}, not a dict"}
            }
        return {"state": state}

    def close(self, msg: dict[str, Any]) -> dict[str, Any]:
        """End the episode: the env's close() when it has one."""
        self._close_env(self.envs.pop(_ep(msg), None), quietly=False)
        return {"cpu_s": _cpu_seconds()}

    def _close_env(self, env: Any, *, quietly: bool) -> None:
        close = getattr(env, "close", None)
        if callable(close):
            try:
                self._await(close())
            except Exception as exc:
                if not quietly:
                    raise _Failure(
                        "episode", f"close() raised {type(exc).__name__}: {exc}"
                    ) from None


# ASCII output (the C encoder's fastest path); one encoder, not one per reply.
_ENCODE = json.JSONEncoder(default=str, separators=(",", ":")).encode


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ep(msg: dict[str, Any]) -> int:
    ep = msg.get("ep", 0)
    if not isinstance(ep, int):
        raise _Failure("config", f"ep must be an integer, got {type(ep).__name__}")
    return ep


def _answer(worker: Worker, msg: dict[str, Any], rid: Any) -> bytes:
    """One reply object (without its newline), capped at the result limit."""
    op = msg.get("op") if isinstance(msg, dict) else None
    try:
        if not isinstance(msg, dict):
            raise _Failure("config", "a call must be an object")
        handler = getattr(worker, op) if op in _OPS else None
        if handler is None:
            raise _Failure("config", f"unknown operation {op!r}")
        body: dict[str, Any] = {"id": rid, "ok": True, "result": handler(msg)}
    except _Failure as exc:
        body = {"id": rid, "ok": False, "kind": exc.kind, "error": str(exc), "type": exc.error_type}
    try:
        line = _ENCODE(body).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        body = {"id": rid, "ok": False, "kind": "tool", "error": f"result is not JSON: {exc}"}
        line = json.dumps(body).encode()
    if len(line) > worker.max_result_bytes:
        body = {
            "id": rid,
            "ok": False,
            "kind": "tool",
            "error": f"{op} result is {len(line)} bytes of JSON; at most "
            f"{worker.max_result_bytes} are returned (return less)",
        }
        line = json.dumps(body).encode()
    return line


def _reply(worker: Worker, msg: dict[str, Any]) -> bytes:
    rid = msg.get("id")
    if msg.get("op") != "batch":
        return _answer(worker, msg, rid) + b"\n"
    # Several episodes' calls in one message (one process switch for all of them); each
    # answer is capped on its own, in order, and one failing call does not stop the others.
    calls = msg.get("calls")
    if not isinstance(calls, list):
        return _answer(worker, {"op": None}, rid) + b"\n"
    parts = [_answer(worker, call, None) for call in calls]
    rid = rid if isinstance(rid, int) else 0
    return b'{"id":%d,"ok":true,"result":{"replies":[%s]}}\n' % (rid, b",".join(parts))


def main() -> None:
    """Serve requests until stdin closes."""
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.dup(1)
    # The plugin's print() and reads of stdin must not touch the protocol.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    worker = Worker()
    for raw in proto_in:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        data = _reply(worker, msg)
        view = memoryview(data)
        while view:
            view = view[os.write(proto_out, view) :]


if __name__ == "__main__":
    main()
