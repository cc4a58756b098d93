"""Python plugin environments: `config.entrypoint = "module.path:function"`.

The function is a factory: `factory(options: dict) -> env`, where `env` implements

    tools() -> list[dict]            # {"name", "description", "parameters"} (OpenAI function shape)
    reset(task: dict) -> None        # start an episode; task has instruction, input, split, id
    step(name: str, arguments: dict) -> Any   # run one tool (may be async); raise to report an error
    state() -> dict                  # what the verifier sees
    close() -> None                  # optional

`tools`, `reset` and `state` are synchronous. The entrypoint is validated like the seed's
`rollout_func`: a string of shape `module.path:function`, no null bytes, at most 260 characters,
and import failures named clearly.

Plugin code never runs in this process: every call goes to a plugin host (plugin_host/), a
sandboxed worker process leased for the episode. A step that raises is a tool error the model
reads, and so is a step that kills its host or hangs past the step timeout: the model's own
arguments did it, and an errored episode is left out of pass rates, so a model that found
arguments that crash the plugin would escape a failed verdict. The call has no effect: the
episode is replayed on a fresh host (reset, then its earlier steps) and goes on to be scored.
A state() that kills its host after the episode's steps, where on a fresh host right after
reset it answers, was made to by those steps: the final state says so (`_stateError`) and is
scored, not errored. What the model's arguments cannot cause stays errored: no host can start or
import the plugin, reset() or state() crashes whatever the steps, or the replay gives different
results (a non-deterministic plugin, whose episode cannot be rebuilt faithfully). The model is told the call crashed or timed out,
not the host's stderr (the plugin's own prints, which may hold what the task hides).
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from pathlib import PurePosixPath
from typing import Any

import structlog
from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.envs.checks import duplicates
from rollout.shared.envs.plugin_host.client import (
    HostFailed,
    HostPool,
    PluginHost,
    ReplyError,
    default_pool,
    starter,
)
from rollout.shared.envs.plugin_host.worker import PluginError, check_entrypoint
from rollout.shared.envs.plugin_sources import bundle_sources, check_sources, unbundled_hint
from rollout.shared.envs.runtime import EnvironmentFailed
from rollout.shared.envs.templates.base import BaseRuntime, ToolError
from rollout.shared.envs.templates.protocol import Template
from rollout.shared.errors import RolloutError

# The config of its specs: a contract (schemas/templates/<name>.json is generated from it).


class PluginConfig(CamelModel):
    """Config of a Python plugin environment: `module.path:function` builds the env object."""

    entrypoint: str
    options: dict[str, Any] = Field(default_factory=dict)
    # The entrypoint's own .py files (relative path -> text), bundled by `push` when the module
    # is the user's code rather than an installed package, so services can import it.
    sources: dict[str, str] = Field(default_factory=dict)


log = structlog.get_logger(__name__)

# A plugin's own top-level module may not take these names: they would shadow the platform or
# the standard library for whatever imports them after it.
RESERVED_TOP_LEVEL = frozenset(sys.stdlib_module_names) | {"rollout"}


def shadowing_problems(config: PluginConfig) -> list[str]:
    """Problems (with their config path) of a plugin that would shadow rollout or the stdlib."""
    problems = []
    top = config.entrypoint.partition(":")[0].split(".")[0] if config.entrypoint else ""
    if top == "rollout" or (config.sources and top in RESERVED_TOP_LEVEL):
        problems.append(
            f"config.entrypoint: top-level module {top!r} is reserved ("
            + ("the platform's own package" if top == "rollout" else "a standard-library module")
            + "); name your plugin's package something else"
        )
    for path in sorted(config.sources or {}):
        parts = PurePosixPath(str(path)).parts
        name = parts[0].removesuffix(".py") if parts else ""
        if name in RESERVED_TOP_LEVEL:
            kind = (
                "the platform's own package" if name == "rollout" else "a standard-library module"
            )
            problems.append(
                f"config.sources[{path!r}]: top-level module {name!r} would shadow {kind}; "
                "rename it"
            )
    return problems


def lease_host(
    config: PluginConfig, pool: HostPool | None = None, *, spare: bool = False, members: int = 1
) -> PluginHost:
    """A host that imported this plugin (PluginError naming any config problem)."""
    check_entrypoint(config.entrypoint)
    problems = shadowing_problems(config)
    if problems:
        raise PluginError(problems[0].partition(": ")[2])
    if config.sources:
        try:
            check_sources(config.sources)
        except RolloutError as exc:
            raise PluginError(exc.message) from None
    pool = pool or default_pool()
    if members > 1:
        return pool.lease_shared(config.entrypoint, config.sources, members)
    return pool.lease(config.entrypoint, config.sources, spare=spare)


def start_group(
    spec: EnvironmentSpec,
    tasks: list[TaskSpec],
    config: PluginConfig,
    pool: HostPool | None = None,
) -> list[PluginRuntime]:
    """Runtimes for one batch's episodes; with episodes_per_host > 1 they share hosts.

    Blocking (call it from a thread). Episodes sharing a host send their steps of a turn in
    one message; when the host dies, each is replayed on a host of its own (PluginRuntime).
    A config error (PluginError) gives back what was started and is raised.
    """
    pool = pool or default_pool()
    size = pool.settings.episodes_per_host
    if size <= 1 or len(tasks) <= 1:
        return [PluginRuntime(spec, t, config, pool) for t in tasks]
    out: list[PluginRuntime] = []
    for start in range(0, len(tasks), size):
        chunk = tasks[start : start + size]
        try:
            host = lease_host(config, pool, members=len(chunk))
        except HostFailed as exc:  # crashed or hung importing: these episodes end, errored
            out.extend(PluginRuntime(spec, t, config, pool, failure=str(exc)) for t in chunk)
            continue
        except PluginError:
            _give_up(out)
            raise
        for i, t in enumerate(chunk):
            try:
                out.append(PluginRuntime(spec, t, config, pool, shared=host, ep=i))
            except PluginError:  # that member gave its share back; so do the rest
                for _ in range(len(chunk) - i - 1):
                    pool.release(host)
                _give_up(out)
                raise
    return out


def _give_up(runtimes: list[PluginRuntime]) -> None:
    for rt in runtimes:
        rt.abandon_now()


class StepKilledHost(Exception):
    """A step crashed its host or hung past the step timeout: that call's tool error (the
    episode was replayed on a fresh host, as it was before the call)."""

    def __init__(self, hung: bool, timeout_s: float, disk: bool = False) -> None:
        if disk:
            # The plugin's own doing on the model's arguments, as a crash is: the model reads it.
            what = "wrote more than the tool's disk budget (stopped: disk_limit)"
        elif hung:
            what = f"did not finish within {timeout_s:g}s (stopped)"
        else:
            what = "crashed the tool's process"
        super().__init__(f"{what}; the call had no effect")


class PluginRuntime(BaseRuntime):
    """One episode of a plugin environment, played in a leased plugin host."""

    template = "plugin"

    def __init__(
        self,
        spec: EnvironmentSpec,
        task: TaskSpec,
        config: PluginConfig,
        pool: HostPool | None = None,
        *,
        shared: PluginHost | None = None,
        ep: int = 0,
        failure: str | None = None,
    ) -> None:
        super().__init__(spec, task)
        self._pool = pool or default_pool()
        self._failure: str | None = failure
        self._host: PluginHost | None = None
        self._finalizer: weakref.finalize | None = None
        self._ep = ep  # this episode's slot on a host shared by its batch (start_group)
        self._config = config
        # On a shared host, a step whose host dies may have died of a partner's step: it runs
        # again once on a host of its own (then a death is its own).
        self._shared = shared is not None
        # What this episode's steps returned, so that it can be replayed on a fresh host when
        # its host dies (of a step of its own or of a partner's) and go on. The results are
        # the objects the trajectory keeps anyway: remembering them costs no copy.
        self._history: list[tuple[dict[str, Any], tuple[Any, ...]]] = []
        self._task_view = {
            "instruction": task.instruction,
            "input": task.input or {},
            "split": task.split,
            "id": task.id,
        }
        if failure is not None:  # its batch's shared host could not start
            return
        if shared is not None:
            self._host = shared
        else:
            try:
                self._host = lease_host(config, self._pool, spare=True)
            except HostFailed as exc:  # crashed or hung importing: this episode ends, errored
                self._failure = str(exc)
                return
        # A runtime dropped without close() must not keep its host (a process) for good.
        self._finalizer = weakref.finalize(self, self._pool.abandon, self._host)
        try:
            result = self._host.call("reset", self._reset_payload())
        except PluginError:
            self._give_back()
            raise
        except HostFailed as exc:
            self._failure = str(exc)
            self._give_back()
            return
        except ReplyError as exc:  # reset() raised: this episode cannot start
            self._failure = f"plugin {str(exc)}"
            self._give_back()
            return
        self.host_cpu_s = result.get("cpu_s")
        for tool in result.get("tools") or []:
            self.add_tool(
                tool["name"], tool["description"], tool["parameters"], self._handler(tool["name"])
            )

    @property
    def failure(self) -> str | None:
        """Why this episode ended early (host crash/timeout, reset raised), or None."""
        return self._failure

    def abandon_now(self) -> None:
        """Give the host back without an async close (the start of its batch failed)."""
        self._give_back()

    def _give_back(self) -> None:
        """Return the host to the pool (a failed one is closed there)."""
        host, self._host = self._host, None
        if self._finalizer is not None:
            self._finalizer.detach()
        if host is not None:
            self._pool.release(host)

    def _live_host(self) -> PluginHost:
        if self._host is None or self._failure is not None:
            raise EnvironmentFailed(self._failure or "the episode is closed")
        return self._host

    def tool_specs(self):  # type: ignore[no-untyped-def]
        """Tools the model may call (EnvironmentFailed when the episode could not start)."""
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        return super().tool_specs()

    def _reset_payload(self) -> dict[str, Any]:
        return {"ep": self._ep, "options": dict(self._config.options), "task": self._task_view}

    def _handler(self, name: str):  # type: ignore[no-untyped-def]
        async def run(args: dict[str, Any]) -> Any:
            call = {"name": name, "arguments": args}
            try:
                result = await self._step(call)
            except StepKilledHost as exc:
                raise ToolError(f"{name} failed: {exc}") from None
            except HostFailed as exc:  # no fresh host: call_tool turns this into the episode's end
                self._failure = str(exc)
                self._give_back()
                raise ToolError(str(exc)) from None
            except ReplyError as exc:
                if exc.error_type in (None, "ToolError"):
                    raise ToolError(str(exc)) from None
                raise ToolError(f"{name} failed: {exc.error_type}: {exc}") from None
            return result.get("output")

        return run

    async def _step(self, call: dict[str, Any]) -> dict[str, Any]:
        host = self._live_host()
        try:
            result = await host.aqueued("step", {"ep": self._ep, **call})
        except ReplyError as exc:
            self._remember(call, ("tool", str(exc), exc.kind, exc.error_type))
            raise
        except HostFailed as exc:
            shared, hung = self._shared, host.hung
            disk = host.process.killed_reason == "disk_limit"
            self._give_back()  # its share of the dead host (here, on the loop's thread)
            # A fresh host with this episode's steps so far (HostFailed, ending it, when none
            # can be had or the replay differs).
            await asyncio.get_running_loop().run_in_executor(starter(), self._recover, exc)
            if shared:
                return await self._step(call)  # on its own host now
            log.info(
                "plugin_host.step_killed_host", entrypoint=self._config.entrypoint, reason=str(exc)
            )
            raise StepKilledHost(hung, self._pool.settings.step_timeout_s, disk) from None
        self._remember(call, ("ok", result))
        return result

    def _remember(self, call: dict[str, Any], outcome: tuple[Any, ...]) -> None:
        self._history.append((call, outcome))

    def _recover(self, cause: HostFailed) -> None:
        """Replay this episode on a host of its own after its host died (blocking).

        The host died of another episode's step (on a shared host) or of this episode's own
        step, which is not replayed: a deterministic plugin gives the same results again and
        the episode goes on; otherwise it ends, saying why (HostFailed).
        """
        self._shared = False  # once: on its own host a crash is its own
        steps = len(self._history)
        try:
            host = lease_host(self._config, self._pool)
        except (PluginError, RolloutError) as exc:  # RolloutError: no sandbox here (HostFailed too)
            raise HostFailed(f"{cause}; no host to replay this episode on: {exc}") from None
        self._host, self._ep = host, 0
        self._finalizer = weakref.finalize(self, self._pool.abandon, host)
        try:
            host.call("reset", self._reset_payload())
            for i, (call, outcome) in enumerate(self._history, 1):
                try:
                    got: tuple[Any, ...] = ("ok", host.call("step", {"ep": 0, **call}))
                except ReplyError as exc:
                    got = ("tool", str(exc), exc.kind, exc.error_type)
                if got != outcome:
                    raise HostFailed(
                        f"{cause}; replaying this episode's {steps} steps on a host of its own "
                        f"gave a different result at step {i}, so it cannot go on"
                    )
        except (ReplyError, PluginError) as exc:
            raise HostFailed(f"{cause}; replaying this episode failed: {exc}") from None
        log.info("plugin_host.episode_replayed", entrypoint=self._config.entrypoint, steps=steps)

    async def call_tool(self, name: str, arguments: dict[str, Any]):  # type: ignore[no-untyped-def]
        """BaseRuntime.call_tool, except that a failed host ends the episode (raises)."""
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        result = await super().call_tool(name, arguments)
        if self._failure is not None:
            raise EnvironmentFailed(self._failure)
        return result

    def final_state(self) -> dict[str, Any]:
        """The plugin's state() (EnvironmentFailed when its host is gone)."""
        own = False  # whether state() itself took a host of this episode's own down
        try:
            host = self._live_host()
            if self._shared and not host.alive:
                # Its shared host died after this episode's last step: replay it first (this
                # blocks, but only after a crash).
                self._give_back()
                self._recover(HostFailed(host.dead or "plugin host died"))
                host = self._live_host()
            try:
                state = host.call("state", {"ep": self._ep}).get("state")
            except HostFailed as exc:
                if not self._shared:
                    own = True
                    raise
                # A partner's step may have killed the shared host meanwhile: once more, on a
                # host of its own with this episode's steps replayed.
                self._give_back()
                self._recover(exc)
                own = True
                state = self._live_host().call("state", {"ep": self._ep}).get("state")
        except HostFailed as exc:
            self._failure = str(exc)
            self._give_back()
            if own and self._history and self._state_after_reset_answers():
                # The steps the model chose did it: a verdict on what it left, not an error.
                return {
                    "_stateError": f"state() took the plugin's host down after this episode's "
                    f"steps ({exc}); on a fresh host after reset it answers"
                }
            raise
        except ReplyError as exc:
            return {"_stateError": str(exc)}
        return state if isinstance(state, dict) else {"_stateError": "state() is not a dict"}

    def _state_after_reset_answers(self) -> bool:
        """Whether state() answers (or raises) on a fresh host right after reset, with no
        step (blocking): then it was this episode's steps that made it kill its host."""
        try:
            host = lease_host(self._config, self._pool)
        except (PluginError, RolloutError):  # RolloutError: no sandbox here (HostFailed too)
            return False
        try:
            host.call("reset", {**self._reset_payload(), "ep": 0})
            host.call("state", {"ep": 0})
        except ReplyError:
            return True  # it raised (a verdict of its own), but the host lived
        except (HostFailed, PluginError):
            return False
        finally:
            self._pool.release(host)
        return True

    async def close(self) -> None:
        """End the episode in the host (its close()) and give the host back."""
        host = self._host
        if host is None:
            return
        try:
            result = await host.aqueued("close", {"ep": self._ep})
            host.cpu_s = float(result.get("cpu_s") or 0.0)
        except HostFailed:
            pass  # the pool closes a failed host
        except ReplyError:
            pass  # close() raised: the episode is over anyway; the env object is dropped
        self._give_back()


__all__ = [
    "PluginError",
    "PluginRuntime",
    "ToolError",
    "check_entrypoint",
    "lease_host",
    "shadowing_problems",
]


class PluginTemplate(Template):
    """Python plugin environments (`module.path:function`), run in a sandboxed plugin host."""

    name = "plugin"
    config_model = PluginConfig
    runtime = PluginRuntime
    starts_in_host = True

    def complete_config(self, config: dict[str, Any]) -> None:
        """Bundle the entrypoint module's own source (see plugin_sources) unless given."""
        entrypoint = config.get("entrypoint")
        if "sources" in config or not isinstance(entrypoint, str) or ":" not in entrypoint:
            return

        sources = bundle_sources(entrypoint)
        if sources:
            config["sources"] = sources

    def tool_names(self, config: PluginConfig) -> None:
        """Only the plugin knows its tools."""
        return None

    def plan_tools(self, config: PluginConfig, out: list[str]) -> list[str] | None:
        """Ask the plugin for its tools, in a plugin host (never imported in this process)."""
        refused = shadowing_problems(config)
        if refused:
            out.extend(refused)
            return None
        try:
            host = lease_host(config)
            try:
                result = host.call("reset", {"options": dict(config.options), "probe": True})
            finally:
                default_pool().release(host)
        except (PluginError, HostFailed, ReplyError) as exc:
            out.append(f"config.entrypoint: {exc}{unbundled_hint(str(exc), config.sources)}")
            return None
        except RolloutError as exc:  # no sandbox here: say so, never import it unsandboxed
            out.append(f"config.entrypoint: the plugin host cannot start: {exc.message}")
            return None
        names = [t["name"] for t in result.get("tools") or []]
        duplicates(names, lambda i: f"config.entrypoint: tools()[{i}].name", "tool", out)
        return names

    def start_group(
        self,
        spec: EnvironmentSpec,
        tasks: Any,
        config: PluginConfig,
        pool: HostPool | None = None,
    ) -> list[Any]:
        """Episodes of one batch, sharing hosts (blocking: call it from a thread)."""
        return list(start_group(spec, list(tasks), config, pool))


TEMPLATE = PluginTemplate()
