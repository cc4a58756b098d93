"""`rollout test FILE --model M`: run a model on an env's tasks locally, score, show the trace.

No platform round trip: the env file is loaded and validated, each selected task gets a fresh
runtime, the agent loop calls the model directly (all tasks batched together), and the
verifier scores every trajectory.

Exit codes: 0 when every selected task ran and was scored (FAIL verdicts included: a failing
task is a finding, not a crash); 1 when the env is invalid, a task could not run (runtime
would not start, the model request failed, the verifier could not run) or the model is
misconfigured; 2 on usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from rollout.errors import RolloutError

TRACE_CLIP = 160


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `test` verb."""
    test = sub.add_parser(
        "test",
        help="run a model on an environment's tasks locally and score them",
        description=(
            "Load FILE, run --model on each selected task through the env's tools, score "
            "each trajectory with the verifier, and print PASS/FAIL, the score, the tool-call "
            "trace and the verifier's reasons."
        ),
        epilog=(
            "models: openai/<model> (OPENAI_API_KEY, OPENAI_BASE_URL), together/<model> "
            "(TOGETHER_API_KEY), http(s)://host:port/v1#<model> or "
            "openai-compatible:<base_url>#<model> (vllm serve, gateways), hf:<dir> (local). "
            "Exit 0 when every task ran (FAIL included), 1 on errors or an invalid env."
        ),
    )
    test.add_argument("file", metavar="FILE", help="a .py file defining Environment(s)")
    test.add_argument("--model", "-m", required=True, help="model to run, e.g. openai/gpt-4o")
    test.add_argument("--slug", help="only the environment with this slug")
    test.add_argument(
        "--task", type=_non_negative, metavar="N", help="only task number N (0-based)"
    )
    test.add_argument("--split", help="only tasks of this split (train, test, ...)")
    test.add_argument("--limit", type=_positive, metavar="N", help="at most N tasks")
    test.add_argument(
        "--temperature", type=_temperature, default=0.0, help="sampling temperature (default 0)"
    )
    test.add_argument("--top-p", type=_top_p, default=1.0, help="nucleus sampling (default 1)")
    test.add_argument("--max-tokens", type=_positive, metavar="N", help="per model turn")
    test.add_argument("--seed", type=int, help="sampling seed")
    test.add_argument(
        "--max-tool-calls", type=_non_negative, default=20, metavar="K", help="per task (20)"
    )
    test.add_argument("--system-prompt", help="replace the default system prompt")
    test.add_argument("--json", action="store_true", help="print one JSON document")
    test.set_defaults(func=_test)


def _test(args: argparse.Namespace) -> int:
    # Logs go to stderr (stdout carries the report, or the --json document); quiet by default.
    from rollout.shared.observability import configure_logging

    configure_logging("rollout-test", level=os.environ.get("ROLLOUT_LOG_LEVEL", "WARNING"))
    try:
        report = asyncio.run(_run(args))
    except RolloutError as exc:
        if args.json:
            _print_json({"ok": False, "error": exc.message, "problems": exc.problems})
            return 1
        raise
    if args.json:
        _print_json(report)
    else:
        _print_report(report)
    return 0 if report["ok"] else 1


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from rollout.shared.agent.loop import DEFAULT_SYSTEM_PROMPT, SamplingParams
    from rollout.shared.envs.loader import load_environments, select_environment
    from rollout.shared.envs.sandbox_required import require_sandbox
    from rollout.shared.envs.validation import validate_environment
    from rollout.shared.models.base import close_backend
    from rollout.shared.models.catalog import resolve_backend

    envs = select_environment(load_environments(args.file), args.slug)
    invalid = []
    for env in envs:
        problems = validate_environment(env)
        if problems:
            invalid.extend(f"{env.slug}: {p}" for p in problems)
    if invalid:
        raise RolloutError(
            f"{args.file}: invalid environment (run `rollout plan`)", problems=invalid
        )
    selections = [(env.to_spec(), _select_tasks(env.to_spec(), args)) for env in envs]

    # Before any model call: without a sandbox every code-editing task would error alike.
    await require_sandbox({spec.template for spec, _ in selections})

    backend = resolve_backend(args.model)
    try:
        await _require_endpoint(backend, args.model)
    except BaseException:
        await close_backend(backend)
        raise
    sampling = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed
    )
    system_prompt = args.system_prompt if args.system_prompt is not None else DEFAULT_SYSTEM_PROMPT
    started = time.monotonic()
    reports = []
    try:
        for spec, indices in selections:
            reports.append(
                await _run_env(spec, indices, backend, sampling, system_prompt, args.max_tool_calls)
            )
    finally:
        await close_backend(backend)
    tasks = [t for r in reports for t in r["tasks"]]
    summary = _summary(tasks)
    summary["seconds"] = round(time.monotonic() - started, 3)
    return {
        "ok": summary["errors"] == 0,
        "file": args.file,
        "model": args.model,
        "environments": reports,
        "summary": summary,
    }


async def _require_endpoint(backend: Any, model: str) -> None:
    """Ask the model's endpoint once, before any task, as the actors do before a run.

    A dead endpoint would otherwise cost every task its retries (about 12 s each) before
    anything is said; here it is one line naming the endpoint and what to fix.
    """
    from rollout.shared.models.base import backend_problem

    problem = await backend_problem(backend)
    if problem is None:
        return
    endpoint = getattr(backend, "endpoint", None)
    where = "--model"
    if model.startswith(("openai/", "together/")) and endpoint is not None:
        # The URL is the operator's: the built-in one, OPENAI_BASE_URL, or the endpoints file.
        where = "the built-in URL" if endpoint.source == "built-in default" else endpoint.source
    raise RolloutError(f"model {model}: {problem} (its URL comes from {where}; no task was run)")


def _ranges(indices: list[int]) -> str:
    """Sorted task indices as runs: `0..3, 7, 9..10`."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in runs)


def _select_tasks(spec: Any, args: argparse.Namespace) -> list[int]:
    indices = list(range(len(spec.tasks)))
    if args.task is not None:
        if args.task >= len(spec.tasks):
            raise RolloutError(
                f"--task {args.task}: {spec.slug!r} has {len(spec.tasks)} task(s) "
                f"(0..{len(spec.tasks) - 1})"
            )
        indices = [args.task]
    if args.split is not None:
        indices = [i for i in indices if spec.tasks[i].split == args.split]
        if not indices and args.task is not None and any(t.split == args.split for t in spec.tasks):
            # The split has tasks; the one asked for is not among them.
            raise RolloutError(
                f"--task {args.task}: task {args.task} of {spec.slug!r} is in split "
                f"{spec.tasks[args.task].split!r}, not {args.split!r} (its {args.split} tasks: "
                f"{_ranges([i for i, t in enumerate(spec.tasks) if t.split == args.split])})"
            )
        if not indices:
            splits = sorted({t.split for t in spec.tasks})
            raise RolloutError(
                f"--split {args.split}: {spec.slug!r} has no such task (splits: {splits})"
            )
    if args.limit is not None:
        indices = indices[: args.limit]
    if not indices:
        raise RolloutError(f"{spec.slug!r} has no tasks to test")
    return indices


async def _run_env(
    spec: Any,
    indices: list[int],
    backend: Any,
    sampling: Any,
    system_prompt: str,
    max_tool_calls: int,
) -> dict[str, Any]:
    from rollout.shared.agent.loop import Episode, run_episodes
    from rollout.shared.contracts.budgets import resolve_budgets
    from rollout.shared.envs.engine import build_runtime, score

    runtimes: dict[int, Any] = {}
    startup_errors: dict[int, str] = {}
    for i in indices:
        try:
            runtimes[i] = build_runtime(spec, i)
        except RolloutError as exc:
            startup_errors[i] = str(exc)
    results: dict[int, dict[str, Any]] = {}
    try:
        order = [i for i in indices if i in runtimes]
        episodes = [Episode(runtimes[i], spec.tasks[i].instruction) for i in order]
        trajectories = await run_episodes(
            episodes,
            backend,
            system_prompt=system_prompt,
            max_tool_calls=max_tool_calls,
            sampling=sampling,
            budgets=resolve_budgets(spec.budgets, None),
        )
        for i, trajectory in zip(order, trajectories, strict=True):
            verdict = await score(spec, i, trajectory)
            results[i] = _task_report(spec, i, trajectory, verdict)
    finally:
        for runtime in runtimes.values():
            await runtime.close()
    for i, reason in startup_errors.items():
        results[i] = _error_report(spec, i, f"runtime did not start: {reason}")
    tasks = [results[i] for i in indices]
    return {
        "slug": spec.slug,
        "template": spec.template,
        "tasks": tasks,
        "summary": _summary(tasks),
    }


def _task_report(spec: Any, index: int, trajectory: Any, verdict: Any) -> dict[str, Any]:
    task = spec.tasks[index]
    error = trajectory.error or verdict.error
    status = "ERROR" if error else ("PASS" if verdict.passed else "FAIL")
    return {
        "index": index,
        "id": task.id,
        "split": task.split,
        "instruction": task.instruction,
        "status": status,
        "passed": bool(verdict.passed) and not error,
        # An episode that errored has no verdict (as on the platform): not a score of 0.25.
        "score": None if error else round(float(verdict.score), 6),
        "error": error,
        "finishReason": trajectory.finish_reason,
        "finalOutput": trajectory.final_output,
        "toolCalls": [
            {
                "index": c.index,
                "name": c.name,
                "arguments": c.arguments,
                "result": c.result,
                "error": c.error,
            }
            for c in trajectory.tool_calls
        ],
        "verifier": [
            {
                "name": p.name,
                "type": p.type,
                "weight": p.weight,
                "score": p.score,
                "passed": p.passed,
                "reason": p.reason,
            }
            for p in verdict.primitives
        ],
        "finalState": trajectory.final_state,
    }


def _error_report(spec: Any, index: int, error: str) -> dict[str, Any]:
    task = spec.tasks[index]
    return {
        "index": index,
        "id": task.id,
        "split": task.split,
        "instruction": task.instruction,
        "status": "ERROR",
        "passed": False,
        "score": None,
        "error": error,
        "finishReason": "error",
        "finalOutput": None,
        "toolCalls": [],
        "verifier": [],
        "finalState": {},
    }


def _summary(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts, and the pass rate and mean score over the verdicts (None with none)."""
    judged = [t for t in tasks if t["status"] != "ERROR"]
    n = len(judged)
    return {
        "tasks": len(tasks),
        "passed": sum(1 for t in tasks if t["status"] == "PASS"),
        "failed": sum(1 for t in tasks if t["status"] == "FAIL"),
        "errors": len(tasks) - n,
        "passRate": round(sum(1 for t in judged if t["passed"]) / n, 6) if n else None,
        "meanScore": round(sum(t["score"] for t in judged) / n, 6) if n else None,
    }


def _score(value: float | None) -> str:
    """A score to two places; `-` for none (an errored episode has no verdict)."""
    return "-" if value is None else f"{value:.2f}"


def _print_report(report: dict[str, Any]) -> None:
    for env in report["environments"]:
        print(
            f"{env['slug']} ({env['template']}) · {report['model']} · {len(env['tasks'])} task(s)"
        )
        for task in env["tasks"]:
            print()
            print(
                f"[{task['index']}] {task['status']}  score {_score(task['score'])}"
                f"  {task['instruction']}"
            )
            if task["toolCalls"]:
                print("    tool calls:")
                for call in task["toolCalls"]:
                    args = _clip(json.dumps(call["arguments"], ensure_ascii=False))
                    if call["error"] is not None:
                        outcome = "error: " + _clip(call["error"])
                    else:
                        outcome = _clip(_show(call["result"]))
                    print(f"      {call['index'] + 1}. {call['name']}({args}) -> {outcome}")
            else:
                print("    tool calls: none")
            if task["finalOutput"]:
                print(f"    final answer: {_clip(task['finalOutput'])}")
            if task["finishReason"] not in ("stop", "error"):
                print(f"    stopped: {task['finishReason']}")
            if task["error"]:
                print(f"    error: {task['error']}")
            state = task.get("finalState")
            if isinstance(state, dict) and isinstance(state.get("_stateError"), str):
                # The plugin's state() failed: scored as a state holding only this marker, so
                # each check reads "missing"; the author's bug is here, not in the verifier.
                print(f"    state() failed: {_clip(state['_stateError'])} (scored without a state)")
            if task["error"] and task["verifier"]:
                print("    verifier: no verdict (the task errored)")
            elif task["verifier"]:
                print("    verifier:")
                for p in task["verifier"]:
                    mark = "✓" if p["passed"] else "✗"
                    print(
                        f"      {mark} {p['name']} ({p['type']}, w={p['weight']:g}, "
                        f"score {p['score']:.2f}): {p['reason']}"
                    )
        s = env["summary"]
        print()
        print(
            f"{env['slug']}: {s['passed']}/{s['tasks']} passed · mean score "
            f"{_score(s['meanScore'])}" + (f" · {s['errors']} error(s)" if s["errors"] else "")
        )
    s = report["summary"]
    if len(report["environments"]) > 1:
        print(
            f"all: {s['passed']}/{s['tasks']} passed · mean score {_score(s['meanScore'])}"
            + (f" · {s['errors']} error(s)" if s["errors"] else "")
        )
    print(f"done in {s['seconds']:.1f}s")


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _clip(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= TRACE_CLIP else text[: TRACE_CLIP - 1] + "…"


def _print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, default=str, ensure_ascii=False)
    sys.stdout.write("\n")


def _positive(value: str) -> int:
    number = _int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return number


def _non_negative(value: str) -> int:
    number = _int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value!r}")
    return number


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None


def _temperature(value: str) -> float:
    number = _float(value)
    if not 0 <= number <= 2:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2, got {value!r}")
    return number


def _top_p(value: str) -> float:
    number = _float(value)
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value!r}")
    return number


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
