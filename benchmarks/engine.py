"""Engine overhead: workflow tool steps/s and verifier scores/s against plain Python doing the
same dict operations in the same process; sandboxed test runs/s against the bare command;
plugin steps/s through the sandboxed plugin host against the same plugin called in-process.

Run: `python benchmarks/engine.py [--steps N] [--scores N] [--sandbox-runs N] [--plugin-steps N]
[--plugin-rounds N]` (0 skips a section).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout import (
    Environment,
    Task,
    action_tool,
    lookup_tool,
    primitive,
    verifier_config,
    workflow_config,
)
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.envs import build_runtime, score

ORDERS = [{"id": f"O-{i}", "customer": f"c{i}", "amount": i} for i in range(50)]


def make_env() -> Environment:
    """The README's helper-style refund env with a templated action value."""
    return Environment(
        slug="bench",
        template="workflow",
        config=workflow_config(
            tools=[
                lookup_tool("get_order", from_array="orders", match_field="id"),
                action_tool(
                    "refund",
                    state_array="refunds",
                    value={"order_id": "${args.order_id}", "amount": "${args.amount}"},
                    params_schema={"order_id": "string", "amount": "number"},
                ),
            ],
            fixtures={"orders": ORDERS},
            initial_mutable_state={"refunds": []},
        ),
        tasks=[Task(instruction="x", hidden_ground_truth={"refunds.length": 1})],
        verifier=verifier_config(
            primitive("called", "tool_was_called", tool="get_order"),
            primitive("count", "state_match", expected={"refunds.length": 1}, weight=2),
            primitive("no_errors", "no_tool_errors"),
        ),
    )


def _calls(n: int) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for i in range(n):
        oid = f"O-{i % 50}"
        if i % 2:
            out.append(("refund", {"order_id": oid, "amount": i % 50}))
        else:
            out.append(("get_order", {"id": oid}))
    return out


async def engine_steps(n: int) -> float:
    """Tool calls/s through build_runtime + call_tool (fresh runtime every 100 steps)."""
    env = make_env().to_spec()
    calls = _calls(n)
    start = time.perf_counter()
    rt = build_runtime(env, 0)
    for i, (name, args) in enumerate(calls):
        if i % 100 == 0:
            rt = build_runtime(env, 0)
        result = await rt.call_tool(name, args)
        assert result.ok, result.error
    return n / (time.perf_counter() - start)


def baseline_steps(n: int) -> float:
    """The same lookups and appends as plain dict operations."""
    import copy

    calls = _calls(n)
    start = time.perf_counter()
    state: dict[str, Any] = {"refunds": []}
    for i, (name, args) in enumerate(calls):
        if i % 100 == 0:
            state = {"refunds": []}
        if name == "get_order":
            found = next(o for o in ORDERS if o["id"] == args["id"])
            copy.deepcopy(found)
        else:
            state["refunds"].append({"order_id": args["order_id"], "amount": args["amount"]})
    return n / (time.perf_counter() - start)


def _trajectory() -> Trajectory:
    return Trajectory(
        tool_calls=[
            ToolCallRecord(index=0, name="get_order", arguments={"id": "O-1"}),
            ToolCallRecord(index=1, name="refund", arguments={"order_id": "O-1", "amount": 1}),
        ],
        final_state={"refunds": [{"order_id": "O-1", "amount": 1}]},
    )


async def engine_scores(n: int) -> float:
    """Verifier results/s through score() with three primitives."""
    env = make_env().to_spec()
    traj = _trajectory()
    task = env.tasks[0]
    start = time.perf_counter()
    for _ in range(n):
        result = await score(env, task, traj)
        assert result.passed
    return n / (time.perf_counter() - start)


def baseline_scores(n: int) -> float:
    """The same three checks written by hand."""
    traj = _trajectory()
    start = time.perf_counter()
    for _ in range(n):
        called = any(c.name == "get_order" for c in traj.tool_calls)
        count = len(traj.final_state["refunds"]) == 1
        clean = not any(c.error for c in traj.tool_calls)
        assert called and count and clean
    return n / (time.perf_counter() - start)


async def sandbox_runs(n: int) -> tuple[float, float] | None:
    """(sandboxed runs/s, bare runs/s) of `python3 -c pass` in a temp dir; None without bwrap."""
    from rollout.errors import RolloutError
    from rollout.shared.envs.sandbox import run_sandboxed

    cmd = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            await run_sandboxed(cmd, Path(tmp))
        except RolloutError as exc:
            print(f"sandbox: skipped ({exc})")
            return None
        start = time.perf_counter()
        for _ in range(n):
            await run_sandboxed(cmd, Path(tmp))
        boxed = n / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(n):
            proc = await asyncio.create_subprocess_exec(*cmd, cwd=tmp)
            assert await proc.wait() == 0
        bare = n / (time.perf_counter() - start)
    return boxed, bare


# ---------------------------------------------------------------- plugin host

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PLUGIN_EPISODE_STEPS = 20


def _plugin_spec() -> Any:
    from rollout.shared.envs import load_environments

    (env,) = load_environments(EXAMPLES / "plugin_counter.py")
    return env.to_spec()


class _InProcessPlugin:
    """The baseline: the same plugin imported here and called through BaseRuntime.call_tool,
    as PluginRuntime did before the host (fresh env object per episode, JSON-safe outputs)."""

    def __init__(self, spec: Any, task_index: int) -> None:
        from rollout.shared.envs.plugin_host import worker
        from rollout.shared.envs.templates.base import BaseRuntime

        config = spec.typed_config()
        factory = worker.resolve_entrypoint(config.entrypoint)
        self.env = worker.make_env(factory, config.entrypoint, config.options)
        task = spec.tasks[task_index]
        self.env.reset({"instruction": task.instruction, "input": task.input or {}})
        self.rt = BaseRuntime(spec, task)
        self.rt.sanitize_outputs = True
        for tool in worker.tool_dicts(self.env):
            name = tool["name"]
            self.rt.add_tool(name, tool["description"], tool["parameters"], self._handler(name))

    def _handler(self, name: str) -> Any:
        async def run(args: dict[str, Any]) -> Any:
            return self.env.step(name, args)

        return run


async def _episodes(make: Any, n: int, concurrency: int) -> float:
    """Steps/s of `concurrency` episodes stepping together, PLUGIN_EPISODE_STEPS each."""
    per_lane = max(1, n // concurrency)

    async def lane(k: int) -> None:
        done = 0
        while done < per_lane:
            rt = make(k)
            for _ in range(min(PLUGIN_EPISODE_STEPS, per_lane - done)):
                result = await rt.call_tool("read", {})
                assert result.ok, result.error
                done += 1
            await rt.close()

    start = time.perf_counter()
    await asyncio.gather(*(lane(k) for k in range(concurrency)))
    return per_lane * concurrency / (time.perf_counter() - start)


def pipe_floor(n: int) -> float:
    """Round trips/s of one line to a sandboxed echo process: the IPC floor of any host."""
    import os

    from rollout.shared.envs.sandbox import start_sandboxed

    echo = "import os, sys\nfor line in sys.stdin.buffer:\n    os.write(1, line)\n"
    with tempfile.TemporaryDirectory() as tmp:
        box = start_sandboxed([sys.executable, "-I", "-S", "-c", echo], Path(tmp))
        try:
            assert box.proc.stdin is not None and box.proc.stdout is not None
            inp, out = box.proc.stdin.fileno(), box.proc.stdout.fileno()
            os.write(inp, b"{}\n")
            os.read(out, 64)
            start = time.perf_counter()
            for _ in range(n):
                os.write(inp, b'{"id": 1}\n')
                os.read(out, 64)
            return n / (time.perf_counter() - start)
        finally:
            box.kill()


@dataclass
class PluginNumbers:
    """Per-round steps/s through the host and in-process, and their per-round ratios."""

    hosted: list[float]
    inproc: list[float]
    ratios: list[float]
    hosts_started: int

    def line(self, lanes: int) -> str:
        """One printed line: medians, [min-max] ranges, the target."""

        def spread(values: list[float], fmt: str) -> str:
            return (
                f"{format(statistics.median(values), fmt)} "
                f"[{format(min(values), fmt)}-{format(max(values), fmt)}]"
            )

        episodes = f"{lanes:>2} episode{'s' if lanes > 1 else ' '} at once"
        return (
            f"plugin steps/s ({episodes}): host {spread(self.hosted, ',.0f')}  "
            f"in-process {spread(self.inproc, ',.0f')}  "
            f"ratio {spread(self.ratios, '.3f')}  (median [range] of {len(self.ratios)} "
            f"alternated rounds; target >= 0.2; {self.hosts_started} hosts started)"
        )


async def plugin_steps(n: int, concurrency: int, rounds: int = 7) -> PluginNumbers:
    """Host and in-process steps/s of the counter plugin, measured in alternated rounds."""
    from rollout.shared.envs.plugin_host.client import default_pool

    sys.path.insert(0, str(EXAMPLES))
    spec = _plugin_spec()
    started = default_pool().started

    def hosted(k: int) -> Any:
        return build_runtime(spec, k % len(spec.tasks))

    def inproc(k: int) -> Any:
        return _InProcessPlugin(spec, k % len(spec.tasks)).rt

    # Warm: one host per lane exists before timing (a service keeps them warm across batches).
    await _episodes(hosted, concurrency * PLUGIN_EPISODE_STEPS, concurrency)
    await _episodes(inproc, concurrency * PLUGIN_EPISODE_STEPS, concurrency)
    # Short rounds of both, in alternating order: on a shared machine both see the same load,
    # and the per-round ratio is what the load leaves comparable.
    per_round = max(concurrency * PLUGIN_EPISODE_STEPS, n // rounds)
    out = PluginNumbers([], [], [], 0)
    for r in range(rounds):
        if r % 2:
            inproc_rate = await _episodes(inproc, per_round, concurrency)
            host_rate = await _episodes(hosted, per_round, concurrency)
        else:
            host_rate = await _episodes(hosted, per_round, concurrency)
            inproc_rate = await _episodes(inproc, per_round, concurrency)
        out.hosted.append(host_rate)
        out.inproc.append(inproc_rate)
        out.ratios.append(host_rate / inproc_rate)
    out.hosts_started = default_pool().started - started
    return out


async def main() -> None:
    """Run every measurement and print numbers and ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--scores", type=int, default=5_000)
    parser.add_argument("--sandbox-runs", type=int, default=10)
    parser.add_argument("--plugin-steps", type=int, default=5_000)
    parser.add_argument("--plugin-rounds", type=int, default=7)
    args = parser.parse_args()

    if args.plugin_steps > 0:
        print(f"sandboxed pipe round trips/s (IPC floor): {pipe_floor(args.plugin_steps):,.0f}")
        for lanes in (1, 16):
            numbers = await plugin_steps(args.plugin_steps, lanes, args.plugin_rounds)
            print(numbers.line(lanes))

    if args.steps > 0:
        eng, base = await engine_steps(args.steps), baseline_steps(args.steps)
        print(
            f"workflow tool steps/s: engine {eng:,.0f}  plain python {base:,.0f}  "
            f"ratio {eng / base:.3f}"
        )
    if args.scores > 0:
        eng_s, base_s = await engine_scores(args.scores), baseline_scores(args.scores)
        print(
            f"verifier scores/s:     engine {eng_s:,.0f}  plain python {base_s:,.0f}  "
            f"ratio {eng_s / base_s:.4f}"
        )
    if args.sandbox_runs > 0:
        runs = await sandbox_runs(args.sandbox_runs)
        if runs:
            boxed, bare = runs
            print(
                f"test command runs/s:   sandboxed {boxed:.1f}  bare {bare:.1f}  "
                f"ratio {boxed / bare:.3f}"
            )


if __name__ == "__main__":
    asyncio.run(main())
