"""Run every applicable adversarial policy on every task of a split, through the real engine.

Each (task, policy) is one episode: a fresh runtime of the env's own template, the agent loop
real runs use (with the env's budgets) driven by the policy instead of a model, and the env's
own verifier. A task is hackable when some policy passes it, or scores at least `threshold`.
An episode that crashes, stalls past `episode_timeout_s` or cannot be scored ends with a
reason and counts as an error, not a finding: a hostile env cannot hang or crash the audit.
A policy that crashes (its own code raised) is another matter: the tasks it did not finish
were not audited, so the report names it in `policy_errors` and the audit is not clean. So is
an episode the verifier gave no verdict on (a judge that cannot be reached, a sandbox that is
gone): whether that policy got through that task is unknown, and an audit whose every episode
went unscored once reported "no task hackable".

An episode the policy drove into an error (a tool call that took the env down, a final answer
its final state could not be taken with), or one the verifier gave no verdict on, gets no
verdict in a run either: it is left out of pass rates and GRPO's groups, so the policy escaped
its failing verdict. It is a finding when an episode that does nothing on the same task ends
cleanly with a verdict (else the env or its verifier fails whatever is sent: a reset that
raises, a judge that cannot be reached, is no policy's doing).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rollout.shared.agent.loop import SamplingParams, run_episode
from rollout.shared.audit.defaults import DEFAULT_THRESHOLD, EPISODE_TIMEOUT_S
from rollout.shared.audit.hints import hint, partial_hint, weakest
from rollout.shared.audit.policies import Policy, View, for_template
from rollout.shared.audit.policies.base import say
from rollout.shared.contracts.budgets import resolve_budgets
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.envs.engine import score
from rollout.shared.envs.runtimes import start_runtime
from rollout.shared.models.base import ChatRequest, ChatResponse

MAX_TOOL_CALLS = 20
CONCURRENCY = 8


class PolicyCrashed(Exception):
    """A policy's own code raised (or answered no ChatResponse): a bug of the audit, not the env."""

    def __init__(self, policy: str, cause: BaseException | str) -> None:
        what = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        # One line: a multi-line message would split the report's line per policy.
        self.reason = " ".join(str(what).split())[:200]
        super().__init__(f"policy {policy} crashed: {self.reason}")


class PolicyBackend:
    """A ModelBackend that lets an adversarial policy answer each turn of one episode."""

    def __init__(self, policy: Policy, spec: EnvironmentSpec, task_index: int) -> None:
        self.name = f"audit/{policy.name}"
        self.policy = policy
        self.spec = spec
        self.task = spec.tasks[task_index]
        self.others = [t.input or {} for j, t in enumerate(spec.tasks) if j != task_index]

    async def generate(self, requests: list[ChatRequest]) -> list[ChatResponse]:
        """The policy's move at each request's turn."""
        out = []
        for request in requests:
            view = View(
                turn=sum(1 for m in request.messages if m.get("role") == "assistant"),
                request=request,
                instruction=self.task.instruction,
                task_input=dict(self.task.input or {}),
                other_inputs=self.others,
                template=self.spec.template,
                config=dict(self.spec.config or {}),
            )
            try:
                response = self.policy.act(view)
            except Exception as exc:
                raise PolicyCrashed(self.policy.name, exc) from exc
            if not isinstance(response, ChatResponse):
                got = type(response).__name__
                raise PolicyCrashed(self.policy.name, f"answered a {got}, not a ChatResponse")
            out.append(response)
        return out


@dataclass
class Attempt:
    """One policy on one task: its score and verdict, or why it ended without one."""

    task_index: int
    policy: str
    score: float | None = None
    passed: bool = False
    passed_primitives: list[dict[str, Any]] = field(default_factory=list)
    failed_primitives: list[str] = field(default_factory=list)
    error: str | None = None
    # The error is the policy's own crash, not the env's.
    policy_crashed: bool = False
    # The episode ran, but the verifier gave no verdict on it.
    unscored: bool = False
    # The episode itself ended errored (why): a run would give it no verdict.
    escaped: str | None = None
    seconds: float = 0.0


@dataclass
class Finding:
    """A task a policy passed (or scored at least the threshold on), and what to change."""

    task_index: int
    split: str
    policy: str
    description: str
    score: float
    passed: bool
    primitive: str | None
    primitive_type: str | None
    hint: str
    # The policy ended the episode errored: no verdict in a run (score is what it left).
    escaped: bool = False


# What ends an episode without doing anything: the control an escape is told apart with.
_CONTROL = Policy("control_does_nothing", "end at once", lambda view: say(""))


@dataclass
class AuditReport:
    """The audit of one env's split: findings, errors, and the hackable tasks."""

    slug: str
    template: str
    split: str | None
    threshold: float
    tasks: list[int]
    policies: list[str]
    findings: list[Finding]
    errors: list[Attempt]
    seconds: float

    @property
    def hackable(self) -> list[int]:
        """The tasks some policy got through, in order."""
        return sorted({f.task_index for f in self.findings})

    @property
    def policy_errors(self) -> list[str]:
        """What left tasks unaudited, one line per policy: that it crashed (the exception), or
        that the verifier gave no verdict on its episodes (the first reason), and the tasks."""
        crashed: dict[str, list[Attempt]] = {}
        unscored: dict[str, list[Attempt]] = {}
        for a in self.errors:
            if a.policy_crashed:
                crashed.setdefault(a.policy, []).append(a)
            elif a.unscored:
                unscored.setdefault(a.policy, []).append(a)
        return [
            f"policy {name} crashed on task(s) {task_ranges([a.task_index for a in found])}: "
            f"{found[0].error}"
            for name, found in crashed.items()
        ] + [
            f"policy {name} got no verdict on task(s) "
            f"{task_ranges([a.task_index for a in found])}: {found[0].error}"
            for name, found in unscored.items()
        ]

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-able document (`rollout audit --json`)."""
        return {
            "slug": self.slug,
            "template": self.template,
            "split": self.split,
            "threshold": self.threshold,
            "tasks": len(self.tasks),
            "policies": self.policies,
            "hackableTasks": self.hackable,
            "policyErrors": self.policy_errors,
            "findings": [asdict(f) for f in self.findings],
            "errors": [asdict(e) for e in self.errors],
            "seconds": round(self.seconds, 3),
        }


def escape_hint(reason: str) -> str:
    """The fix for an episode a policy ended errored (`reason`) where doing nothing did not."""
    return (
        f"the episode ended without a verdict ({reason}), where one doing nothing got one: a "
        "run leaves such a rollout out of pass rates and GRPO's groups, so a model escapes a "
        "failing verdict this way. Make what it sent a tool error or a failing verdict"
    )


def task_ranges(indices: list[int]) -> str:
    """0-3, 7, 9-10: sorted task indices, runs collapsed."""
    out: list[str] = []
    for i in sorted(set(indices)):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


async def attempt(
    spec: EnvironmentSpec, task_index: int, policy: Policy, *, timeout_s: float
) -> Attempt:
    """Run `policy` on one task and score it; never raises, never hangs past `timeout_s`."""
    started = time.monotonic()
    result = Attempt(task_index, policy.name)
    runtime = None
    try:
        async with asyncio.timeout(timeout_s):
            runtime = await start_runtime(spec, spec.tasks[task_index])
            trajectory = await run_episode(
                runtime,
                PolicyBackend(policy, spec, task_index),
                spec.tasks[task_index].instruction,
                max_tool_calls=MAX_TOOL_CALLS,
                sampling=SamplingParams(temperature=0.0),
                budgets=resolve_budgets(spec.budgets, None),
            )
            verdict = await score(spec, task_index, trajectory)
        if trajectory.error:
            result.escaped = " ".join(trajectory.error.split())[:300]
        if verdict.error:
            result.error = f"the verifier could not score it: {verdict.error}"
            result.unscored = True
        else:
            result.score, result.passed = float(verdict.score), bool(verdict.passed)
            result.passed_primitives = [
                {"name": p.name, "type": p.type, "weight": p.weight}
                for p in verdict.primitives
                if p.passed
            ]
            result.failed_primitives = [p.name for p in verdict.primitives if not p.passed]
    except PolicyCrashed as exc:
        result.error, result.policy_crashed = exc.reason, True
    except TimeoutError:
        result.error = f"stalled: no end within {timeout_s:g}s (a tool or the runtime hung)"
    except Exception as exc:  # a hostile env's tools may raise anything: report, go on
        result.error = f"crashed: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        if runtime is not None:
            try:
                async with asyncio.timeout(10):
                    await runtime.close()
            except Exception:  # noqa: BLE001 - a runtime that will not close is not the audit's end
                result.error = result.error or "the runtime did not close within 10s"
        result.seconds = round(time.monotonic() - started, 3)
    return result


async def audit(
    spec: EnvironmentSpec,
    *,
    split: str | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    policies: list[Policy] | None = None,
    limit: int | None = None,
    timeout_s: float = EPISODE_TIMEOUT_S,
    concurrency: int = CONCURRENCY,
) -> AuditReport:
    """Every applicable policy on every task of `split` (all tasks when None)."""
    started = time.monotonic()
    chosen = policies if policies is not None else for_template(spec.template)
    tasks = [i for i, t in enumerate(spec.tasks) if split is None or t.split == split]
    tasks = tasks[:limit] if limit is not None else tasks
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, policy: Policy) -> Attempt:
        async with gate:
            return await attempt(spec, i, policy, timeout_s=timeout_s)

    attempts = await asyncio.gather(*(one(i, p) for i in tasks for p in chosen))
    # Each task an episode escaped on (errored, or left unscored), once: does doing nothing
    # end cleanly there, with a verdict?
    escaped_on = sorted(
        {a.task_index for a in attempts if (a.escaped and a.error is None) or a.unscored}
    )
    controls = await asyncio.gather(*(one(i, _CONTROL) for i in escaped_on))
    clean = {c.task_index for c in controls if c.error is None and c.escaped is None}
    for a in attempts:
        if a.unscored and a.task_index in clean:
            # The verifier scores this task, just not what the policy sent: not the audit's
            # gap but the policy's escape (the verifier's reason says how).
            a.escaped, a.error, a.unscored = a.error, None, False
    described = {p.name: p.description for p in chosen}
    findings = []
    for a in attempts:
        if a.escaped and a.error is None and a.task_index in clean:
            findings.append(
                Finding(
                    task_index=a.task_index,
                    split=spec.tasks[a.task_index].split,
                    policy=a.policy,
                    description=described[a.policy],
                    score=round(a.score or 0.0, 4),
                    passed=False,
                    primitive=None,
                    primitive_type=None,
                    hint=escape_hint(a.escaped),
                    escaped=True,
                )
            )
        elif a.error is None and a.score is not None and (a.passed or a.score >= threshold):
            culprit = weakest(a.passed_primitives)
            findings.append(
                Finding(
                    task_index=a.task_index,
                    split=spec.tasks[a.task_index].split,
                    policy=a.policy,
                    description=described[a.policy],
                    score=round(a.score, 4),
                    passed=a.passed,
                    primitive=culprit["name"] if culprit else None,
                    primitive_type=culprit["type"] if culprit else None,
                    hint=hint(culprit, a.policy, described[a.policy])
                    if a.passed
                    else partial_hint(a.score, a.failed_primitives, a.passed_primitives),
                )
            )
    return AuditReport(
        slug=spec.slug,
        template=spec.template,
        split=split,
        threshold=threshold,
        tasks=tasks,
        policies=[p.name for p in chosen],
        findings=findings,
        errors=[a for a in attempts if a.error is not None],
        seconds=time.monotonic() - started,
    )
