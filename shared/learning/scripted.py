"""Scripted, ground-truth-derived agents for the example environments (training data only).

`scripted_rollouts(env_files, split="train")` runs each task through the real agent loop with
a `ScriptedBackend` that replays a tool-call plan derived from the task's hidden ground
truth, scores every trajectory with the environment's own verifier and keeps the passing
ones: correct demonstrations in exactly the message format the actor produces. Plans are the
template's (`Template.plan`), or per example env where the ground truth alone does not say
what to do (e.g. the code fix). An environment without a plan contributes nothing; it is reported, not guessed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import structlog

from rollout.shared.agent.loop import run_episode
from rollout.shared.contracts.budgets import resolve_budgets
from rollout.shared.envs.engine import build_runtime, score
from rollout.shared.envs.loader import load_environments
from rollout.shared.envs.templates import get_template
from rollout.shared.envs.templates.protocol import Plan
from rollout.shared.errors import RolloutError
from rollout.shared.learning.examples import example_files
from rollout.shared.models.base import ChatRequest, ChatResponse, ToolCall
from rollout.shared.models.registry import register_backend

log = structlog.get_logger(__name__)

FINAL_ANSWER = "Done."


class ScriptedBackend:
    """A ModelBackend that plays one plan: the k-th assistant turn makes the k-th call."""

    name = "scripted"

    def __init__(self, plan: Plan, final_answer: str = FINAL_ANSWER) -> None:
        self.plan = plan
        self.final_answer = final_answer

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        """Next scripted call for each request (by how many assistant turns it already has)."""
        out = []
        for request in requests:
            turn = sum(1 for m in request.messages if m.get("role") == "assistant")
            if turn < len(self.plan):
                name, args = self.plan[turn]
                call = ToolCall(id=f"call_{turn}", name=name, arguments=json.dumps(args))
                out.append(ChatResponse(tool_calls=[call], finish_reason="tool_calls"))
            else:
                out.append(ChatResponse(content=self.final_answer))
        return out


def _fix_calc_plan(spec: Any, task: Any, runtime: Any) -> Plan | None:
    # The bug cannot be read off the hidden tests: each task's fix is in its ground truth
    # (`solution`: path -> fixed content), which only the verifier and this script see.
    truth = task.hidden_ground_truth
    solution = truth.get("solution") if isinstance(truth, dict) else None
    if not isinstance(solution, dict) or not solution:
        return None
    return [("write_file", {"path": path, "content": text}) for path, text in solution.items()]


def _counter_plan(spec: Any, task: Any, runtime: Any) -> Plan | None:
    truth = task.hidden_ground_truth
    if not isinstance(truth, dict) or not isinstance(truth.get("value"), int):
        return None
    return [("increment", {})] * truth["value"]


def _reservation_plan(spec: Any, task: Any, runtime: Any) -> Plan | None:
    # Look the order up, check its sku's stock, reserve: three calls where the template's plan
    # makes two.
    truth = task.hidden_ground_truth
    records = truth.get("reservations") if isinstance(truth, dict) else None
    if not isinstance(records, list) or not records:
        return None
    plan: Plan = []
    for record in records:
        plan += [
            ("get_order", {"id": record["order_id"]}),
            ("check_stock", {"sku": record["sku"]}),
            ("reserve", dict(record)),
        ]
    return plan


def _returns_plan(spec: Any, task: Any, runtime: Any) -> Plan | None:
    # Look the order up, then the refund and/or the notice its status calls for.
    truth = task.hidden_ground_truth
    if not isinstance(truth, dict):
        return None
    plan: Plan = [("get_order", {"id": task.id})]
    plan += [("refund", dict(r)) for r in truth.get("refunds") or []]
    plan += [("notify_customer", dict(n)) for n in truth.get("notices") or []]
    return plan


# Example envs whose ground truth alone does not say what to do, by slug; every other env
# gets its template's plan (Template.plan).
EXAMPLE_PLANNERS: dict[str, Callable[[Any, Any, Any], Plan | None]] = {
    "fix-calc": _fix_calc_plan,
    "counter-plugin": _counter_plan,
    "stock-reservations": _reservation_plan,
    "returns-desk": _returns_plan,
}


def plan_for(spec: Any, task: Any, runtime: Any) -> Plan | None:
    """The scripted plan for one task, or None when there is no planner for its env."""
    planner = EXAMPLE_PLANNERS.get(spec.slug)
    if planner is not None:
        return planner(spec, task, runtime)
    template = get_template(spec.template)
    return template.plan(spec, task, runtime) if template is not None else None


async def scripted_rollouts(
    env_files: Iterable[Path], *, split: str = "train", per_env: int | None = None
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """Passing scripted rollouts of the `split` tasks (the first `per_env` planned ones of each
    env, all when None), and per-env counts (tasks/planned/passed)."""
    done: list[tuple[str, int, Any, Any, Any, list[dict[str, Any]]]] = []
    counts: dict[str, dict[str, int]] = {}
    for file in sorted(env_files):
        for env in load_environments(file):
            spec = env.to_spec()
            tally = counts.setdefault(spec.slug, {"tasks": 0, "planned": 0, "passed": 0})
            for index, task in enumerate(spec.tasks):
                if task.split != split:
                    continue
                tally["tasks"] += 1
                if per_env is not None and tally["planned"] >= per_env:
                    continue  # enough demonstrations of this env: skip running (and scoring) it
                runtime = build_runtime(spec, task)
                try:
                    plan = plan_for(spec, task, runtime)
                    if plan is None:
                        continue
                    tally["planned"] += 1
                    tools = [s.to_openai() for s in runtime.tool_specs()]
                    trajectory = await run_episode(
                        runtime,
                        ScriptedBackend(plan),
                        task.instruction,
                        budgets=resolve_budgets(spec.budgets, None),
                    )
                finally:
                    await runtime.close()
                done.append((spec.slug, index, spec, task, trajectory, tools))
    # Scoring may run tests in the sandbox (seconds each): score everything concurrently.
    results = await asyncio.gather(*(score(spec, task, tr) for _, _, spec, task, tr, _ in done))
    rollouts: list[dict[str, Any]] = []
    for (slug, index, _, _, trajectory, tools), result in zip(done, results, strict=True):
        if result.error:
            # The verifier could not run (no sandbox): a demonstration set missing a whole env
            # would train a different model silently, so stop with the verifier's reason.
            raise RolloutError(
                f"scripted demonstrations of {slug} could not be checked: {result.error}"
            )
        if not result.passed:
            log.warning("scripted plan failed its verifier", env=slug, task=index)
            continue
        counts[slug]["passed"] += 1
        rollouts.append(
            {
                "env": slug,
                "task_index": index,
                "trajectory": trajectory.model_dump(mode="json"),
                "tools": tools,
                "score": result.score,
            }
        )
    return rollouts, counts


# --- `local/scripted`: the scripted player as a model ----------------------------------------

SCRIPTED_MODEL = "local/scripted"
UNKNOWN_TASK_ANSWER = "I have no scripted plan for this task."


class ScriptedPlayer:
    """`local/scripted`: a ModelBackend that plays the ground-truth plan of the example TRAIN
    task whose instruction it is shown.

    It makes scripted demonstrations ordinary rollouts of a run: a run of `local/scripted` on
    the train split is verified like any model's, and `improve --run` trains a student on its
    passing rollouts (the distillation path, with the script as teacher). It knows train tasks
    only, so no test answer can reach a training set through it; any other instruction gets a
    plain answer with no tool call (a failing rollout).
    """

    name = SCRIPTED_MODEL

    def __init__(self, examples: Path | None = None) -> None:
        self.examples = examples
        self._tasks: dict[str, tuple[Any, Any]] | None = None
        self._plans: dict[str, Plan | None] = {}

    def _index(self) -> dict[str, tuple[Any, Any]]:
        if self._tasks is None:
            tasks: dict[str, tuple[Any, Any]] = {}
            for file in example_files(self.examples):
                for env in load_environments(file):
                    spec = env.to_spec()
                    for task in spec.tasks:
                        if task.split == "train":
                            tasks.setdefault(task.instruction, (spec, task))
            self._tasks = tasks
        return self._tasks

    async def _plan(self, instruction: str) -> Plan | None:
        if instruction not in self._plans:
            found = self._index().get(instruction)
            plan = None
            if found is not None:
                spec, task = found
                runtime = build_runtime(spec, task)
                try:
                    plan = plan_for(spec, task, runtime)
                finally:
                    await runtime.close()
            self._plans[instruction] = plan
        return self._plans[instruction]

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        """The next call of each request's plan (found by its first user message)."""
        out = []
        for request in requests:
            instruction = next(
                (m.get("content") for m in request.messages if m.get("role") == "user"), None
            )
            plan = await self._plan(instruction) if isinstance(instruction, str) else None
            if plan is None:
                out.append(ChatResponse(content=UNKNOWN_TASK_ANSWER))
                continue
            [response] = await ScriptedBackend(plan).generate([request])
            out.append(response)
        return out


def _scripted_backend(rest: str) -> ScriptedPlayer:
    if rest.strip():
        raise RolloutError(
            f"unknown model '{SCRIPTED_MODEL}{rest}': did you mean '{SCRIPTED_MODEL}'?"
        )
    return ScriptedPlayer()


def register() -> None:
    """Make `local/scripted` resolvable."""
    register_backend(SCRIPTED_MODEL, _scripted_backend, example=SCRIPTED_MODEL)


register()
