"""OpenEnv / NeMo Gym serving overhead: episode steps/s through our OpenEnv server
(openenv-core's client over /ws, real uvicorn on loopback), through the `openenv` template
consuming that server, and through the `nemo_gym` template consuming our NeMo Gym resources
server, each against the same env's runtime in-process (measured in the same process).

Each episode: reset, `--steps` tool calls, a final answer (scored by our verifier). Run:
`python benchmarks/openenv_serve.py [--episodes N] [--steps N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time

import uvicorn
from openenv.core.generic_client import GenericEnvClient

from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.envs import build_runtime, score
from rollout.shared.interop.openenv_server import create_app

SPEC = {
    "slug": "bench-openenv",
    "template": "workflow",
    "config": {
        "tools": [
            {"name": "get", "kind": "lookup", "fixturePath": "orders.${args.id}"},
            {
                "name": "refund",
                "kind": "action",
                "appendTo": "refunds",
                "value": {"id": "${args.id}"},
            },
        ],
        "fixtures": {"orders": {f"O-{i}": {"amount": i} for i in range(50)}},
        "initialMutableState": {"refunds": []},
    },
    "tasks": [{"instruction": "refund O-1", "hiddenGroundTruth": {"refunds": [{"id": "O-1"}]}}],
}


def _action(i: int) -> tuple[str, dict]:
    return ("refund", {"id": "O-1"}) if i == 0 else ("get", {"id": f"O-{i % 50}"})


async def in_process(spec: EnvironmentSpec, episodes: int, steps: int) -> tuple[float, float]:
    """(steps/s, mean reward) playing the runtime directly."""
    rewards = 0.0
    t0 = time.perf_counter()
    for _ in range(episodes):
        rt = build_runtime(spec, 0)
        calls = []
        for i in range(steps):
            name, args = _action(i)
            r = await rt.call_tool(name, args)
            calls.append(
                ToolCallRecord(index=i, name=name, arguments=args, result=r.output, error=r.error)
            )
        state = rt.final_state()
        await rt.close()
        verdict = await score(
            spec, 0, Trajectory(tool_calls=calls, final_output="ok", final_state=state)
        )
        rewards += verdict.score
    return episodes * steps / (time.perf_counter() - t0), rewards / episodes


async def over_openenv(url: str, episodes: int, steps: int) -> tuple[float, float]:
    """(steps/s, mean reward) through the server with openenv-core's GenericEnvClient."""
    rewards = 0.0
    async with GenericEnvClient(base_url=url) as env:
        t0 = time.perf_counter()
        for _ in range(episodes):
            await env.reset(task=0)
            for i in range(steps):
                name, args = _action(i)
                await env.step({"tool": name, "arguments": args})
            done = await env.step({"answer": "ok"})
            rewards += float(done.reward or 0.0)
        return episodes * steps / (time.perf_counter() - t0), rewards / episodes


async def through_template(spec: dict, episodes: int, steps: int) -> tuple[float, float]:
    """(steps/s, mean env reward) playing a consumer template (`openenv` / `nemo_gym`)."""
    rewards = 0.0
    t0 = time.perf_counter()
    for _ in range(episodes):
        rt = build_runtime(spec, 0)
        for i in range(steps):
            name, args = _action(i)
            await rt.call_tool(name, args)
        await rt.call_tool("submit_answer", {"answer": "ok"})
        state = rt.final_state()
        await rt.close()
        rewards += float(state["reward"] or 0.0)
    return episodes * steps / (time.perf_counter() - t0), rewards / episodes


def _consumer(template: str, url: str) -> dict:
    return {
        "slug": f"bench-{template.replace('_', '-')}",
        "template": template,
        "config": {"url": url},
        "tasks": [{"instruction": "refund O-1", "input": {"task": 0}}],
    }


def _serve(app: object) -> tuple[uvicorn.Server, threading.Thread, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{port}"


def main() -> None:
    """Print both rates and their ratio."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    from rollout.shared.interop import nemo_gym

    spec = EnvironmentSpec.model_validate(SPEC)
    server, thread, url = _serve(create_app(spec))
    gym, gym_thread, gym_url = _serve(nemo_gym.create_app(spec))
    openenv_spec, gym_spec = _consumer("openenv", url), _consumer("nemo_gym", gym_url)
    try:
        asyncio.run(in_process(spec, 3, args.steps))  # warm-up
        asyncio.run(over_openenv(url, 3, args.steps))
        asyncio.run(through_template(openenv_spec, 3, args.steps))
        asyncio.run(through_template(gym_spec, 3, args.steps))
        base, base_r = asyncio.run(in_process(spec, args.episodes, args.steps))
        served, served_r = asyncio.run(over_openenv(url, args.episodes, args.steps))
        consumed, consumed_r = asyncio.run(
            through_template(openenv_spec, args.episodes, args.steps)
        )
        gymmed, gym_r = asyncio.run(through_template(gym_spec, args.episodes, args.steps))
    finally:
        for srv, th in ((server, thread), (gym, gym_thread)):
            srv.should_exit = True
            th.join(10)
    print(f"episodes={args.episodes} steps/episode={args.steps}")
    print(f"in-process runtime:          {base:10.0f} steps/s  (mean reward {base_r:.2f})")
    print(f"OpenEnv server over /ws:     {served:10.0f} steps/s  (mean reward {served_r:.2f})")
    print(f"openenv template -> server:  {consumed:10.0f} steps/s  (mean reward {consumed_r:.2f})")
    print(f"nemo_gym template -> server: {gymmed:10.0f} steps/s  (mean reward {gym_r:.2f})")
    for label, rate in (("served", served), ("openenv template", consumed), ("nemo_gym", gymmed)):
        print(f"ratio {label} / in-process: {rate / base:.3f}  ({base / rate:.1f}x slower)")


if __name__ == "__main__":
    main()
