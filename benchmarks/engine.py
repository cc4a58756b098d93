"""Engine overhead: workflow tool steps/s and verifier scores/s against plain Python doing the
same dict operations in the same process; sandboxed test runs/s against the bare command;
plugin steps/s through the sandboxed plugin host against the same plugin called in-process.

Run: `python benchmarks/engine.py [--steps N] [--scores N] [--rounds N] [--sandbox-runs N]
[--plugin-steps N] [--plugin-rounds N]` (0 skips a section). Steps and scores alternate engine
and baseline over rounds and print the median per-round ratio: on a shared machine one
back-to-back pair swings by 2x with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
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

# Steps and scores are pure Python in this thread: its CPU time, unlike the wall clock, is
# not stretched by whatever else the machine runs (both sides are timed the same way).
_cpu = time.thread_time

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
    """Tool calls/s (CPU time) through build_runtime + call_tool (fresh runtime every 100 steps)."""
    env = make_env().to_spec()
    calls = _calls(n)
    start = _cpu()
    rt = build_runtime(env, 0)
    for i, (name, args) in enumerate(calls):
        if i % 100 == 0:
            rt = build_runtime(env, 0)
        result = await rt.call_tool(name, args)
        assert result.ok, result.error
    return n / (_cpu() - start)


def baseline_steps(n: int) -> float:
    """The same lookups and appends as plain dict operations."""
    import copy

    calls = _calls(n)
    start = _cpu()
    state: dict[str, Any] = {"refunds": []}
    for i, (name, args) in enumerate(calls):
        if i % 100 == 0:
            state = {"refunds": []}
        if name == "get_order":
            found = next(o for o in ORDERS if o["id"] == args["id"])
            copy.deepcopy(found)
        else:
            state["refunds"].append({"order_id": args["order_id"], "amount": args["amount"]})
    return n / (_cpu() - start)


def fair_baseline_steps(n: int) -> float:
    """baseline_steps plus what the engine may not skip: the model's arguments checked (present,
    typed) before the tool runs, a result the agent loop reads (ToolResult), errors as text."""
    import copy

    from rollout.shared.envs.runtime import ToolResult

    def bad(args: dict[str, Any], types: dict[str, Any]) -> str | None:
        for key, kind in types.items():
            if key not in args:
                return f"missing required argument {key!r}"
            value = args[key]
            if isinstance(value, bool) or not isinstance(value, kind):
                return f"argument {key!r} has the wrong type"
        return None

    get_types = {"id": str}
    refund_types = {"order_id": str, "amount": int | float}
    calls = _calls(n)
    start = _cpu()
    state: dict[str, Any] = {"refunds": []}
    for i, (name, args) in enumerate(calls):
        if i % 100 == 0:
            state = {"refunds": []}
        if name == "get_order":
            problem = bad(args, get_types)
            found = next((o for o in ORDERS if o["id"] == args["id"]), None)
            if problem or found is None:
                result = ToolResult(error=problem or "not found")
            else:
                result = ToolResult(output=copy.deepcopy(found))
        else:
            problem = bad(args, refund_types)
            if problem:
                result = ToolResult(error=problem)
            else:
                value = {"order_id": args["order_id"], "amount": args["amount"]}
                state["refunds"].append(value)
                result = ToolResult(output={"ok": True, "recorded": value})
        assert result.ok
    return n / (_cpu() - start)


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
    start = _cpu()
    for _ in range(n):
        result = await score(env, task, traj)
        assert result.passed
    return n / (_cpu() - start)


def baseline_scores(n: int) -> float:
    """The same three checks written by hand."""
    traj = _trajectory()
    start = _cpu()
    for _ in range(n):
        called = any(c.name == "get_order" for c in traj.tool_calls)
        count = len(traj.final_state["refunds"]) == 1
        clean = not any(c.error for c in traj.tool_calls)
        assert called and count and clean
    return n / (_cpu() - start)


def fair_baseline_scores(n: int) -> float:
    """baseline_scores plus what a verifier returns: each check's score, pass and reason, the
    weighted score, and the VerifierResult every consumer reads."""
    from rollout.shared.contracts.trajectory import VerifierResult

    traj = _trajectory()
    start = _cpu()
    for _ in range(n):
        calls = traj.tool_calls
        got = sum(1 for c in calls if c.name == "get_order")
        refunds = len(traj.final_state["refunds"])
        errors = [c for c in calls if c.error]
        checks = [
            ("called", "tool_was_called", 1.0, got >= 1, f"get_order called {got} time(s)"),
            ("count", "state_match", 2.0, refunds == 1, f"refunds.length {refunds}, expected 1"),
            ("no_errors", "no_tool_errors", 1.0, not errors, f"{len(calls)} call(s), no errors"),
        ]
        prims = [
            {"name": nm, "type": tp, "weight": w, "score": float(ok), "passed": ok, "reason": why}
            for nm, tp, w, ok, why in checks
        ]
        total = sum(p["weight"] for p in prims)
        value = sum(p["weight"] * p["score"] for p in prims) / total
        passed = all(p["passed"] for p in prims)
        result = VerifierResult(score=value, passed=passed, primitives=prims)
        assert result.passed
    return n / (_cpu() - start)


def result_only_scores(n: int) -> float:
    """Only building the VerifierResult a score returns (its three primitives as dicts, one
    pydantic validation: the engine's way, and no slower than model_construct or a hand-built
    instance), with nothing checked: the floor under any verifier that returns the contract."""
    from rollout.shared.contracts.trajectory import VerifierResult

    build = VerifierResult.__pydantic_validator__.validate_python
    start = _cpu()
    for _ in range(n):
        prims = [
            {"name": "called", "type": "tool_was_called", "weight": 1.0, "score": 1.0,
             "passed": True, "reason": "get_order called 1 time(s), needed >= 1"},
            {"name": "count", "type": "state_match", "weight": 2.0, "score": 1.0,
             "passed": True, "reason": "all 1 path(s) match"},
            {"name": "no_errors", "type": "no_tool_errors", "weight": 1.0, "score": 1.0,
             "passed": True, "reason": "2 call(s), no errors"},
        ]  # fmt: skip
        result = build({"score": 1.0, "passed": True, "primitives": prims, "error": None})
        assert result.passed
    return n / (_cpu() - start)


async def _async(measure: Any, n: int) -> float:
    return measure(n)


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


async def _lockstep(start: Any, n: int, size: int) -> float:
    """Steps/s of batches of `size` episodes stepping together, as the agent loop does."""
    done = 0
    begin = time.perf_counter()
    while done < n:
        runtimes = await start(size)
        for _ in range(PLUGIN_EPISODE_STEPS):
            results = await asyncio.gather(*(rt.call_tool("read", {}) for rt in runtimes))
            assert all(r.ok for r in results), [r.error for r in results]
        done += size * PLUGIN_EPISODE_STEPS
        for rt in runtimes:
            await rt.close()
    return done / (time.perf_counter() - begin)


def _spread(values: list[float], fmt: str) -> str:
    return (
        f"{format(statistics.median(values), fmt)} "
        f"[{format(min(values), fmt)}-{format(max(values), fmt)}]"
    )


async def _alternated(
    measures: dict[str, Any], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Rates per measure over rounds (the order rotates each round) and per-round ratios of
    each against the first one, the in-process baseline: on a shared machine the per-round
    ratio is what the load leaves comparable."""
    names = list(measures)
    rates: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names[1:]}
    for r in range(rounds):
        this_round = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            this_round[name] = await measures[name]()
            rates[name].append(this_round[name])
        for name in names[1:]:
            ratios[name].append(this_round[name] / this_round[names[0]])
    return rates, ratios


async def plugin_steps(n: int, rounds: int = 7) -> list[str]:
    """Printed lines: host against in-process steps/s of the counter plugin, one episode at a
    time and a batch of 16 stepping together (own hosts, and one shared host)."""
    from rollout.shared.envs.engine import start_runtimes
    from rollout.shared.envs.plugin_host.client import HostPool, HostSettings, default_pool

    sys.path.insert(0, str(EXAMPLES))
    spec = _plugin_spec()
    tasks = len(spec.tasks)
    lines = []

    def hosted(k: int) -> Any:
        return build_runtime(spec, k % tasks)

    def inproc(k: int) -> Any:
        return _InProcessPlugin(spec, k % tasks).rt

    per_round = max(PLUGIN_EPISODE_STEPS, n // rounds)
    started = default_pool().started
    # Warm: a service keeps its hosts warm across batches.
    await _episodes(hosted, PLUGIN_EPISODE_STEPS, 1)
    rates, ratios = await _alternated(
        {
            "in-process": lambda: _episodes(inproc, per_round, 1),
            "host": lambda: _episodes(hosted, per_round, 1),
        },
        rounds,
    )
    lines.append(
        f"plugin steps/s (1 episode): in-process {_spread(rates['in-process'], ',.0f')}  "
        f"host {_spread(rates['host'], ',.0f')}  ratio {_spread(ratios['host'], '.3f')}  "
        f"({default_pool().started - started} hosts started)"
    )

    batch = 16
    # ROLLOUT_PLUGIN_* settings apply (e.g. ROLLOUT_PLUGIN_QUICK_WAIT_S=0 to compare).
    base = HostSettings.from_env()
    pools = {
        "own hosts": HostPool(base.model_copy(update={"episodes_per_host": 1})),
        "shared host": HostPool(base.model_copy(update={"episodes_per_host": batch})),
    }

    async def inproc_batch(size: int) -> list[Any]:
        return [inproc(k) for k in range(size)]

    def starter(pool: HostPool) -> Any:
        async def start(size: int) -> list[Any]:
            return await start_runtimes(spec, [k % tasks for k in range(size)], pool)

        return start

    per_batch_round = max(batch * PLUGIN_EPISODE_STEPS, n // rounds)
    measures: dict[str, Any] = {
        "in-process": lambda: _lockstep(inproc_batch, per_batch_round, batch)
    }
    for name, pool in pools.items():
        await _lockstep(starter(pool), batch * PLUGIN_EPISODE_STEPS, batch)  # warm
        start = starter(pool)
        measures[name] = lambda start=start: _lockstep(start, per_batch_round, batch)
    try:
        rates, ratios = await _alternated(measures, rounds)
    finally:
        for pool in pools.values():
            pool.close()
    lines.append(f"plugin steps/s (batch of {batch} in lock step): in-process "
                 f"{_spread(rates['in-process'], ',.0f')}")  # fmt: skip
    for name, pool in pools.items():
        per_host = pool.settings.episodes_per_host
        lines.append(
            f"    {name} (episodes_per_host={per_host}): {_spread(rates[name], ',.0f')}  "
            f"ratio {_spread(ratios[name], '.3f')}  ({pool.started} hosts started)"
        )
    lines.append(
        f"    (median [min-max] of {rounds} alternated rounds; target ratio >= 0.2; when a "
        "plugin kills a shared host its partners are replayed on hosts of their own)"
    )
    return lines


async def main() -> None:
    """Run every measurement and print numbers and ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--scores", type=int, default=5_000)
    parser.add_argument("--sandbox-runs", type=int, default=10)
    parser.add_argument("--plugin-steps", type=int, default=20_000)
    parser.add_argument("--plugin-rounds", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=7, help="alternated rounds (steps, scores)")
    args = parser.parse_args()

    if args.plugin_steps > 0:
        print(f"sandboxed pipe round trips/s (IPC floor): {pipe_floor(args.plugin_steps):,.0f}")
        for line in await plugin_steps(args.plugin_steps, args.plugin_rounds):
            print(line)

    for label, count, engine, baseline, fair, fmt in (
        ("workflow tool steps/s", args.steps, engine_steps, baseline_steps, fair_baseline_steps,
         ".3f"),
        ("verifier scores/s", args.scores, engine_scores, baseline_scores, fair_baseline_scores,
         ".4f"),
    ):  # fmt: skip
        if count <= 0:
            continue
        per_round = max(1, count // args.rounds)
        measures = {
            "plain python": lambda b=baseline, n=per_round: _async(b, n),
            "engine": lambda e=engine, n=per_round: e(n),
            "same work": lambda f=fair, n=per_round: _async(f, n),
        }
        if engine is engine_scores:
            measures["result only"] = lambda n=per_round: _async(result_only_scores, n)
        rates, ratios = await _alternated(measures, args.rounds)
        vs_fair = [e / f for e, f in zip(rates["engine"], rates["same work"], strict=True)]
        print(
            f"{label}: engine {_spread(rates['engine'], ',.0f')}  "
            f"plain python {_spread(rates['plain python'], ',.0f')}  "
            f"ratio {_spread(ratios['engine'], fmt)}"
        )
        print(
            f"    plain python doing the same work {_spread(rates['same work'], ',.0f')}  "
            f"ratio {_spread(vs_fair, fmt)}"
        )
        if "result only" in rates:
            # A score does at least the baseline's work and builds the result: its time is at
            # least the sum of the two, so its ratio at most base / (base + result) per round.
            ceiling = [
                (1 / b) / (1 / b + 1 / r)
                for b, r in zip(rates["plain python"], rates["result only"], strict=True)
            ]
            print(
                f"    building the VerifierResult alone {_spread(rates['result only'], ',.0f')}"
                f"  ratio {_spread(ratios['result only'], fmt)}; ceiling for the engine "
                f"(baseline + result) {_spread(ceiling, fmt)}"
            )
    if args.steps > 0 or args.scores > 0:
        print(
            f"    (CPU time, median [min-max] of {args.rounds} alternated rounds, ratio per round; "
            "targets: steps >= 0.5, scores >= 0.25 of plain python)"
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
