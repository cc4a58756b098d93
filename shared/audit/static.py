"""What an env's verifier lets through, seen without running anything (`plan` and `push` warn).

Four static cases, each named by its config path:
- a verifier whose every primitive is `contains_terms`, with terms that appear in the
  instruction of some task: an echo of the instruction passes;
- `tool_was_called` without `args` where no primitive checks the outcome: any call passes;
- weights that give at least 0.75 of the reward to primitives an idle episode passes
  (`no_tool_errors`, `contains_terms` on the instruction's own words): doing nothing scores;
- `final_answer_match` in mode `contains`, or `regex` with a pattern not anchored at both
  ends: an answer that lists every candidate ("0 1 2 ... 1000") holds the right one.

And two about `tests_pass`: hidden tests imported in-process (`testIsolation: in-process`),
and hidden tests that turn values into code (`eval`, `exec`, `pickle.loads`, ...): what the
model's code returns then runs in the tests' own process, where it can forge the report.
"""

from __future__ import annotations

import ast
from typing import Any

from rollout.shared.contracts.envspec import EnvironmentSpec

# Calls in a hidden test that run a value as code (or unpickle it: the same).
CODE_FROM_VALUES = frozenset(
    {"eval", "exec", "compile", "pickle.loads", "pickle.load", "pickle.Unpickler",
     "marshal.loads", "dill.loads", "cloudpickle.loads"}
)  # fmt: skip

# Primitives that check what the episode achieved (not only that something was called).
OUTCOME = frozenset(
    {"state_match", "sql_result_match", "tests_pass", "final_answer_match", "form_submitted",
     "reward_model", "env_reward", "verifiers_rubric", "ruler"}
)  # fmt: skip
IDLE_SHARE = 0.75


def _echoed(params: dict[str, Any], spec: EnvironmentSpec) -> list[int]:
    """Tasks whose instruction contains every term (case-insensitively, unless asked)."""
    terms = params.get("terms")
    terms = [terms] if isinstance(terms, str) else [str(t) for t in terms or []]
    if not terms or params.get("source", "output") != "output":
        return []
    strict = bool(params.get("caseSensitive", params.get("case_sensitive", False)))
    mode_any = params.get("mode") == "any"
    hits = []
    for i, task in enumerate(spec.tasks):
        text = task.instruction if strict else task.instruction.lower()
        found = [t for t in terms if (t if strict else t.lower()) in text]
        if found and (mode_any or len(found) == len(terms)):
            hits.append(i)
    return hits


def verifier_warnings(spec: EnvironmentSpec) -> list[str]:
    """Warnings about the env's own verifier, each with its config path."""
    primitives = list(spec.verifier.primitives) if spec.verifier else []
    if not primitives:
        return []
    out = []
    kinds = {p.type for p in primitives}
    idle = 0.0
    total = sum(p.weight for p in primitives) or 1.0
    for i, p in enumerate(primitives):
        where = f"verifier.primitives[{i}] ({p.name}, {p.type})"
        if p.type == "contains_terms":
            echoed = _echoed(p.params, spec)
            if echoed:
                idle += p.weight
                if kinds == {"contains_terms"}:
                    out.append(
                        f"{where}: its terms appear in the instruction of {len(echoed)} of "
                        f"{len(spec.tasks)} task(s): an answer that repeats the instruction "
                        "passes; check the outcome (state_match, final_answer_match)"
                    )
        elif p.type == "tool_was_called" and not p.params.get("args") and not kinds & OUTCOME:
            out.append(
                f"{where}: no `args` and nothing checks the outcome: any call of "
                f"{p.params.get('tool')!r} passes, junk arguments included"
            )
        elif p.type == "no_tool_errors":
            idle += p.weight
        elif p.type == "final_answer_match" and (why := _finds_a_listed_answer(p.params, spec)):
            out.append(
                f"{where}: {why}: an answer that lists every candidate passes; use mode exact "
                "or numeric, or anchor the pattern (^...$)"
            )
    # Only where an outcome is checked at all: otherwise the warnings above say it.
    if idle / total >= IDLE_SHARE and kinds - {"contains_terms", "no_tool_errors"}:
        out.append(
            f"verifier: {idle / total:.0%} of the weight is on checks an episode passes by "
            "doing nothing (no_tool_errors, contains_terms on the instruction's words): weigh "
            "the outcome checks more"
        )
    elif kinds == {"no_tool_errors"}:
        out.append("verifier: only no_tool_errors: an episode that does nothing passes")
    if "tests_pass" in kinds:
        out += _code_from_values(spec)
    if "tests_pass" in kinds and (spec.config or {}).get("testIsolation") == "in-process":
        out.append(
            "config.testIsolation: in-process: tests_pass imports the model's code into the "
            "hidden tests' process, where code written against the harness can forge a pass "
            "(`rollout audit` shows it: code_forge_harness); drop it to run the code in a "
            "process of its own"
        )
    return out


def _finds_a_listed_answer(params: dict[str, Any], spec: EnvironmentSpec) -> str | None:
    """Why a final_answer_match finds its answer anywhere in a reply (None when it does not)."""
    mode = params.get("mode", "exact")
    if mode == "contains":
        return "mode contains"
    if mode != "regex":
        return None
    expected = params.get("expected")
    if expected is not None:
        patterns = [expected]
    else:  # each task's ground-truth `answer`
        truths = [t.hidden_ground_truth for t in spec.tasks]
        patterns = [t.get("answer") if isinstance(t, dict) else t for t in truths]
    for pattern in patterns:
        if isinstance(pattern, str) and not _anchored(pattern):
            return f"mode regex with /{pattern[:60]}/ not anchored at both ends"
    return None


def _anchored(pattern: str) -> bool:
    starts = pattern.startswith(("^", "\\A"))
    ends = pattern.endswith(("\\Z", "\\z")) or (
        pattern.endswith("$") and not pattern.endswith("\\$")
    )
    return starts and ends


def _called_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return func.attr if isinstance(func, ast.Attribute) else ""


def _code_from_values(spec: EnvironmentSpec) -> list[str]:
    """Hidden test files that call eval/exec/pickle.loads: one warning per file, by path."""
    sources: list[tuple[str, str]] = []
    for path, text in ((spec.config or {}).get("files") or {}).items():
        if path.rsplit("/", 1)[-1].startswith("test") and isinstance(text, str):
            sources.append((f"config.files[{path!r}]", text))
    for i, task in enumerate(spec.tasks):
        truth = task.hidden_ground_truth if isinstance(task.hidden_ground_truth, dict) else {}
        for path, text in (truth.get("tests") or {}).items():
            if isinstance(text, str):
                sources.append((f"tasks[{i}].hiddenGroundTruth.tests[{path!r}]", text))
    out = []
    for where, text in sources:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue  # tests_pass names the file itself
        calls = sorted(
            {
                name
                for node in ast.walk(tree)
                if isinstance(node, ast.Call) and (name := _called_name(node)) in CODE_FROM_VALUES
            }
        )
        if calls:
            out.append(
                f"{where}: calls {', '.join(calls)}: a value of the model's code turned into "
                "code runs in the hidden tests' own process, where it can forge the report; "
                "compare values (==) instead"
            )
    return out[:5]
