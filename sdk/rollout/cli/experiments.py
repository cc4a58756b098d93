"""Experiment plans on the CLI: `rollout plan X.toml`, `rollout run --config X.toml`,
`rollout replay --plan ID` (the verbs themselves live with their .py / run counterparts)."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from typing import Any

from rollout.cli._common import client_settings_or_error, print_json, said_when_stopped
from rollout.errors import RolloutError
from rollout.shared import subjects
from rollout.shared.settings import connect_nats


def register(sub: argparse._SubParsersAction) -> None:
    """No verbs of its own: `plan`, `run` and `replay` call in here."""


async def _reachable_client() -> Any:
    """A client of the configured stack when one answers, else None (refs stay unresolved)."""
    from rollout.client import AsyncClient

    try:
        client = AsyncClient(timeout_s=5.0)
    except RolloutError:
        return None
    try:
        await client.list_environments()
    except RolloutError:
        await client.close()
        return None
    return client


def _print_check(check: Any) -> None:
    if not check.ok:
        print(f"✗ {check.path}: {len(check.problems)} problem(s); nothing was started")
        for p in check.problems:
            print(f"    - {p}")
        for w in check.warnings:
            print(f"    ! {w}")
        for note in check.notes:
            print(f"    note: {note}")
        return
    plan = check.plan
    print(f"✓ {plan.name}: {len(plan.stages)} stage(s), seed {plan.seed}")
    for key, pin in check.envs.items():
        version = f"v{pin['version']}" if pin.get("version") else "(version when pushed)"
        sha = (pin.get("specHash") or "unresolved")[:16]
        print(f"    env {key}: {pin['slug']} {version} [{pin['source']}] sha256 {sha}")
    for key, model in plan.models.items():
        print(f"    model {key}: {model}")
    for i, stage in enumerate(plan.stages):
        print(f"    {i + 1}. {stage.kind:<8} {stage.name}  {_stage_line(stage)}")
    r = plan.resources
    print(f"    resources: replicas {r.replicas}, threads {r.threads or 'default'},"
          f" devices {r.devices}; checkpoint every {plan.checkpoints.save_every} steps")  # fmt: skip
    for w in check.warnings:
        print(f"    ! {w}")
    for note in check.notes:
        print(f"    note: {note}")
    print(f"plan {check.plan_id}  sha256 {check.hash}")


def _stage_line(stage: Any) -> str:
    if stage.train is not None:
        t = stage.train
        source = f"from {t.from_}" if t.from_ else f"on env {t.env}"
        settings = ", ".join(f"{k}={v}" for k, v in sorted(t.config.items()))
        return f"{t.method} of {t.model} {source}" + (f" ({settings})" if settings else "")
    if stage.compare is not None:
        return f"{stage.compare.base} vs {stage.compare.other}"
    spec = stage.run or stage.evaluate
    split = f" split {spec.split}" if spec.split else ""
    return f"{spec.model} on {spec.env}{split} x{spec.n}"


def plan_command(args: argparse.Namespace) -> int:
    """`rollout plan PLAN.toml`: validate everything, print the pinned plan and its hash."""
    from rollout.plans import check_plan

    async def go() -> Any:
        client = await _reachable_client()
        try:
            return await check_plan(args.file, client=client, overrides=args.overrides)
        finally:
            if client is not None:
                await client.close()

    check = asyncio.run(go())
    if args.json:
        print_json(check.to_json())
    else:
        _print_check(check)
    return 0 if check.ok else 1


def run_config_command(args: argparse.Namespace) -> int:
    """`rollout run --config PLAN.toml`: validate, then run it stage by stage (or resume it)."""
    return asyncio.run(run_config(args))


def resume_command(args: argparse.Namespace) -> str:
    """The command line that resumes this plan: the same file and the same overrides."""
    words = ["rollout", "run", "--config", args.config]
    for item in args.overrides or []:
        words += ["--with", item]
    return shlex.join(words)


async def run_config(args: argparse.Namespace) -> int:
    """`rollout run --config PLAN.toml` on the caller's event loop; Ctrl-C or SIGTERM stops it at
    once, saying how to resume (`said_when_stopped`: await it in the main thread).
    """
    # Nothing is cancelled in the services: a run or job is durable, and a rerun of the same
    # plan (same hash, same id) re-attaches to it by the plan's events.
    return await said_when_stopped(
        _run_config(args),
        lambda: (
            f"to resume, run the same command again: {resume_command(args)} (it skips the "
            "completed stages and re-attaches to the interrupted stage's run or job)"
        ),
    )


async def _run_config(args: argparse.Namespace) -> int:
    from rollout.client import AsyncClient
    from rollout.plan_runner import run_plan
    from rollout.plans import check_plan

    def say(line: str) -> None:
        if not args.json:
            print(line, flush=True)

    async def go() -> Any:
        # What needs no stack is checked before connecting to one: a bad file starts nothing.
        check = await check_plan(args.config, overrides=args.overrides)
        if not check.ok:
            return check, None
        client = AsyncClient()
        try:
            check = await check_plan(args.config, client=client, overrides=args.overrides)
            if not check.ok:
                return check, None
            # Said before anything starts, on stderr so that --json stays one document.
            for w in check.warnings:
                print(f"warning: {w}", file=sys.stderr, flush=True)
            return check, await run_plan(client, check, say)
        finally:
            await client.close()

    check, state = await go()
    if state is None:
        if args.json:
            print_json(check.to_json())
        else:
            _print_check(check)
        return 1
    if args.json:
        print_json(state.summary())
    else:
        _print_state(state.summary())
    return 0 if state.status == "completed" else 1


def _print_state(summary: dict[str, Any]) -> None:
    from rollout.plan_runner import describe_outputs

    print(f"plan {summary['planId']}: {summary['status']} ({summary['events']} events)")
    if summary.get("reason"):
        print(f"  reason: {summary['reason']}")
    for s in summary["stages"]:
        outputs = s["outputs"]
        shown = describe_outputs(outputs, ("runId", "passRate", "jobId", "model", "deltaPassRate"))
        print(
            f"  {s['name']:<20} {s['status']:<10} {shown}{'  ' + s['reason'] if s['reason'] else ''}"
        )


def replay_plan_command(args: argparse.Namespace) -> int:
    """`rollout replay --plan ID`: a plan's stages and outcomes rebuilt from its events."""
    from rollout.plans import load_plan_state

    subjects.token(args.plan, "plan id")

    async def go() -> Any:
        nc = await connect_nats(client_settings_or_error())
        try:
            return await load_plan_state(nc.jetstream(), args.plan)
        finally:
            await nc.close()

    state = asyncio.run(go())
    if state.hash is None:
        print(f"error: no plan {args.plan!r} on the log (see `rollout events`)", file=sys.stderr)
        return 1
    if args.json:
        print_json({"plan": state.summary(), "canonical": state.plan})
    else:
        _print_state(state.summary())
    return 0
