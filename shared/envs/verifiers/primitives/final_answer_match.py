"""`final_answer_match`: the final answer equals, is near or matches the expected one."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable
from typing import Any, Literal

import regex
from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.compare import short, values_equal
from rollout.shared.envs.verifiers.patterns import (
    BoundedPattern,
    PatternTooSlow,
    pattern_problem,
    search_any,
)
from rollout.shared.envs.verifiers.primitives.common import MISSING, binary, lookup
from rollout.shared.envs.verifiers.registry import (
    Outcome,
    ScoreContext,
    register,
)


class FinalAnswerMatchParams(CamelModel):
    """`final_answer_match`: the answer equals / is numerically close to / matches `expected`.

    `exact` compares both sides trimmed, without enclosing quotes, code or bold marks and one
    final full stop (any case unless `case_sensitive`)."""

    expected: Any = None
    mode: Literal["exact", "numeric", "regex", "contains"] = "exact"
    tolerance: float = Field(default=1e-6, ge=0)
    rel_tolerance: float = Field(default=0.0, ge=0)
    case_sensitive: bool = False
    source: str = "output"


# The minus sign as typeset (U+2212) and its small and fullwidth forms are minus too: read as
# no sign, "−42" passed an expected 42 and failed an expected -42.
_MINUSES = "\u2212\ufe63\uff0d"
_NUMBER = re.compile(rf"[-+{_MINUSES}]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_AS_ASCII = str.maketrans(dict.fromkeys(_MINUSES, "-") | {",": None})


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    for token in reversed(found):
        try:
            return float(token.translate(_AS_ASCII))
        except ValueError:
            continue
    return None


# Wrappers a chat model puts around a short answer: quotes, code or bold marks, a full stop.
_WRAPPERS = (('"', '"'), ("'", "'"), ("`", "`"), ("**", "**"), ("*", "*"), ("_", "_"))


def _bare(text: str) -> str:
    """`text` trimmed, without enclosing quotes/code/bold marks or one final `.` or `!`:
    "**Paris.**" and "Paris" are the same exact answer, "Paris, France" is not."""
    text = text.strip()
    changed = True
    while changed and text:
        changed = False
        for left, right in _WRAPPERS:
            if (
                len(text) > len(left) + len(right)
                and text.startswith(left)
                and text.endswith(right)
            ):
                text, changed = text[len(left) : -len(right)].strip(), True
        if text[-1:] in (".", "!") and not text.endswith(".."):
            text, changed = text[:-1].rstrip(), True
    return text


def _expected_answer(p: FinalAnswerMatchParams, ctx: ScoreContext) -> Any:
    if p.expected is not None:
        return p.expected
    gt = ctx.ground_truth
    if isinstance(gt, dict):
        return gt.get("answer")
    return gt


async def _regex_outcome(pattern: BoundedPattern, text: str) -> Outcome:
    try:
        ok = await search_any(pattern, [text])
    except PatternTooSlow as exc:
        return binary(False, str(exc))
    verb = "matches" if ok else "does not match"
    return binary(ok, f"{short(text, 80)} {verb} /{pattern.pattern}/")


def _check(p: FinalAnswerMatchParams) -> list[tuple[str, str]]:
    """A regex `expected` must compile (a wrong one would fail every rollout)."""
    if p.mode == "regex" and p.expected is not None:
        if (problem := pattern_problem(p.expected)) is not None:
            return [("expected", problem)]
    return []


@register("final_answer_match", FinalAnswerMatchParams, check=_check)
def final_answer_match(
    p: FinalAnswerMatchParams, ctx: ScoreContext
) -> Outcome | Awaitable[Outcome]:
    """The final answer equals / is within tolerance of / matches the expected answer."""
    expected = _expected_answer(p, ctx)
    if expected is None:
        return binary(False, "no expected answer (params.expected or ground truth `answer`)")
    if p.source == "output":
        actual: Any = ctx.trajectory.final_output
    else:
        actual = lookup(ctx.state, p.source)
        if actual is MISSING:
            return binary(False, f"{p.source}: not in the final state")
    if actual is None:
        return binary(False, "no final answer")
    text = actual if isinstance(actual, str) else json.dumps(actual, ensure_ascii=False)
    if p.mode == "regex":
        try:
            pattern = BoundedPattern(str(expected), ignore_case=not p.case_sensitive)
        except regex.error as exc:
            return binary(False, f"bad regex {expected!r}: {exc}")
        return _regex_outcome(pattern, text)
    if p.mode == "contains":
        want = str(expected)
        ok = (want in text) if p.case_sensitive else (want.lower() in text.lower())
        return binary(ok, f"answer {'contains' if ok else 'lacks'} {want!r}")
    if p.mode == "numeric" or (
        isinstance(expected, int | float) and not isinstance(expected, bool)
    ):
        try:
            want_num = float(expected)
        except (TypeError, ValueError):
            return binary(False, f"expected {short(expected)} is not a number")
        got = (
            float(actual)
            if isinstance(actual, int | float) and not isinstance(actual, bool)
            else _last_number(text)
        )
        if got is None:
            return binary(False, f"no number in the answer {short(text, 80)}")
        tol = p.tolerance if p.mode == "numeric" else 0.0
        ok = math.isclose(got, want_num, rel_tol=p.rel_tolerance, abs_tol=tol) or got == want_num
        return binary(ok, f"answer {got:g} vs expected {want_num:g} (tolerance {tol:g})")
    if isinstance(expected, str):
        a, b = _bare(text), _bare(expected)
        ok = a == b if p.case_sensitive else a.casefold() == b.casefold()
        return binary(ok, f"answer {short(a, 80)} {'==' if ok else '!='} {short(b, 80)}")
    # Structured expectation: the answer must be JSON equal to it.
    if isinstance(actual, str):
        try:
            actual = json.loads(actual)
        except json.JSONDecodeError:
            return binary(False, f"answer is not JSON; expected {short(expected)}")
    ok = values_equal(expected, actual)
    return binary(ok, f"answer {short(actual)} {'==' if ok else '!='} {short(expected)}")
