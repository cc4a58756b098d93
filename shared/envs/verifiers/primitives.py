"""The verifier primitives. Each returns an Outcome with a reason a person can act on."""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any

from rollout.shared.contracts.envspec import (
    CodeEditingConfig,
    ContainsTermsParams,
    FinalAnswerMatchParams,
    FormSubmittedParams,
    NoToolErrorsParams,
    SqlConfig,
    SqlResultMatchParams,
    StateMatchParams,
    TaskSpec,
    TestsPassParams,
    ToolCallOrderParams,
    ToolWasCalledParams,
    UrlReachedParams,
)
from rollout.shared.contracts.trajectory import Trajectory
from rollout.shared.envs.compare import canonical, multiset_equal, normalise, short, values_equal
from rollout.shared.envs.paths import PathError, parse_cached, resolve_path
from rollout.shared.envs.templates.base import ToolError
from rollout.shared.envs.templates.code_editing import (
    is_pytest_command,
    run_hidden_tests,
    run_tests_in_sandbox,
    task_files,
    test_command,
    trusted_test_files,
)
from rollout.shared.envs.templates.sql import SUBMIT_ROW_CAP, open_database, run_query
from rollout.shared.envs.verifiers.registry import (
    Compiled,
    InfraError,
    Outcome,
    ScoreContext,
    register,
    register_compiled,
)
from rollout.shared.errors import RolloutError

_MISSING = object()


def _binary(ok: bool, reason: str) -> Outcome:
    return Outcome(1.0 if ok else 0.0, ok, reason)


def _lookup(state: Any, key: str) -> Any:
    # A literal top-level key wins (so "orders.O-1" can be a key); otherwise it is a path.
    if isinstance(state, dict) and key in state:
        return state[key]
    try:
        return resolve_path(state, key)
    except PathError:
        return _MISSING


def _text_of(ctx: ScoreContext, source: str) -> str | None:
    if source == "output":
        return ctx.trajectory.final_output or ""
    if source == "messages":
        parts = []
        for m in ctx.trajectory.messages:
            content = m.get("content")
            if m.get("role") == "assistant" and isinstance(content, str):
                parts.append(content)
        return "\n".join(parts)
    value = _lookup(ctx.state, source)
    if value is _MISSING:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _state_match(expected: Any, state: Any, partial: bool) -> tuple[float, bool, str]:
    if expected is None:
        return 0.0, False, "nothing to compare: no expected state and no hidden ground truth"
    if not isinstance(expected, dict):
        return 0.0, False, f"expected state must be an object of paths, got {short(expected)}"
    if not expected:
        return 1.0, True, "no paths to check"
    misses = []
    for key, want in expected.items():
        have = _lookup(state, key)
        if have is _MISSING:
            misses.append(f"{key}: missing (expected {short(want)})")
        elif not values_equal(want, have, partial=partial):
            misses.append(f"{key}: expected {short(want)}, got {short(have)}")
    matched = len(expected) - len(misses)
    if not misses:
        return 1.0, True, f"all {len(expected)} path(s) match"
    return matched / len(expected), False, "; ".join(misses)


def _segments(key: str) -> tuple[Any, ...] | None:
    try:
        return parse_cached(key)
    except PathError:
        return None


@register_compiled("state_match")
def state_match(p: StateMatchParams) -> Compiled:
    """Each expected path in the final state equals its value (numbers by value)."""
    partial = p.partial
    fixed = p.expected
    if not isinstance(fixed, dict) or not fixed:
        # The hidden ground truth (or a degenerate expectation): read on every score.
        def from_task(trajectory: Trajectory, task: TaskSpec) -> tuple[float, bool, str]:
            expected = fixed if fixed is not None else task.hidden_ground_truth
            return _state_match(expected, trajectory.final_state or {}, partial)

        return from_task
    # Fixed paths: parsed once; the general loop (_state_match) runs when one misses.
    checks = [(key, want, _segments(key)) for key, want in fixed.items()]
    all_match = f"all {len(fixed)} path(s) match"

    def run(trajectory: Trajectory, task: TaskSpec) -> tuple[float, bool, str]:
        state = trajectory.final_state or {}
        is_dict = isinstance(state, dict)
        for key, want, segments in checks:
            if is_dict and key in state:
                have = state[key]
            elif segments is None:
                return _state_match(fixed, state, partial)
            else:
                try:
                    have = resolve_path(state, segments)
                except PathError:
                    return _state_match(fixed, state, partial)
            if not values_equal(want, have, partial=partial):
                return _state_match(fixed, state, partial)
        return 1.0, True, all_match

    return run


@register("contains_terms")
def contains_terms(p: ContainsTermsParams, ctx: ScoreContext) -> Outcome:
    """The output (or a state path) contains all / any of the terms."""
    text = _text_of(ctx, p.source)
    if text is None:
        return _binary(False, f"{p.source}: not in the final state")
    hay = text if p.case_sensitive else text.lower()
    found = [t for t in p.terms if (t if p.case_sensitive else t.lower()) in hay]
    missing = [t for t in p.terms if t not in found]
    if p.mode == "any":
        ok = bool(found)
        why = f"found {found}" if ok else f"none of {p.terms} in {p.source}"
        return _binary(ok, why)
    ok = not missing
    why = f"all {len(p.terms)} term(s) found" if ok else f"missing in {p.source}: {missing}"
    return Outcome(len(found) / len(p.terms), ok, why)


@register_compiled("tool_was_called", tool_fields=("tool",))
def tool_was_called(p: ToolWasCalledParams) -> Compiled:
    """The tool was called (with matching args) between minCount and maxCount times."""
    tool, args, successful_only = p.tool, p.args, p.successful_only
    low, high = p.min_count, p.max_count
    what = tool + (f" with {short(args)}" if args else "")
    bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
    # The reason is f"{what} called {count} time(s), needed {bounds}".
    head, tail = f"{what} called ", f" time(s), needed {bounds}"

    def run(trajectory: Trajectory, task: TaskSpec) -> tuple[float, bool, str]:
        count = 0
        for call in trajectory.tool_calls:
            if call.name != tool or (successful_only and call.error):
                continue
            if args is not None and not all(
                k in call.arguments
                and (values_equal(v, call.arguments[k]) or str(v) == str(call.arguments[k]))
                for k, v in args.items()
            ):
                continue
            count += 1
        ok = count >= low and (high is None or count <= high)
        return (1.0 if ok else 0.0), ok, f"{head}{count}{tail}"

    return run


@register_compiled("no_tool_errors", tool_fields=("tools",))
def no_tool_errors(p: NoToolErrorsParams) -> Compiled:
    """No tool call returned an error."""
    tools = p.tools

    def run(trajectory: Trajectory, task: TaskSpec) -> tuple[float, bool, str]:
        calls = trajectory.tool_calls
        errors = [c for c in calls if c.error and (tools is None or c.name in tools)]
        if not errors:
            return 1.0, True, f"{len(calls)} call(s), no errors"
        first = errors[0]
        why = f"{len(errors)} tool error(s); first: {first.name}: {(first.error or '')[:160]}"
        return 0.0, False, why

    return run


_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    for token in reversed(found):
        try:
            return float(token.replace(",", ""))
        except ValueError:
            continue
    return None


def _expected_answer(p: FinalAnswerMatchParams, ctx: ScoreContext) -> Any:
    if p.expected is not None:
        return p.expected
    gt = ctx.ground_truth
    if isinstance(gt, dict):
        return gt.get("answer")
    return gt


@register("final_answer_match")
def final_answer_match(p: FinalAnswerMatchParams, ctx: ScoreContext) -> Outcome:
    """The final answer equals / is within tolerance of / matches the expected answer."""
    expected = _expected_answer(p, ctx)
    if expected is None:
        return _binary(False, "no expected answer (params.expected or ground truth `answer`)")
    if p.source == "output":
        actual: Any = ctx.trajectory.final_output
    else:
        actual = _lookup(ctx.state, p.source)
        if actual is _MISSING:
            return _binary(False, f"{p.source}: not in the final state")
    if actual is None:
        return _binary(False, "no final answer")
    text = actual if isinstance(actual, str) else json.dumps(actual, ensure_ascii=False)
    flags = 0 if p.case_sensitive else re.IGNORECASE
    if p.mode == "regex":
        try:
            ok = re.search(str(expected), text, flags) is not None
        except re.error as exc:
            return _binary(False, f"bad regex {expected!r}: {exc}")
        return _binary(
            ok, f"{short(text, 80)} {'matches' if ok else 'does not match'} /{expected}/"
        )
    if p.mode == "contains":
        want = str(expected)
        ok = (want in text) if p.case_sensitive else (want.lower() in text.lower())
        return _binary(ok, f"answer {'contains' if ok else 'lacks'} {want!r}")
    if p.mode == "numeric" or (
        isinstance(expected, int | float) and not isinstance(expected, bool)
    ):
        try:
            want_num = float(expected)
        except (TypeError, ValueError):
            return _binary(False, f"expected {short(expected)} is not a number")
        got = (
            float(actual)
            if isinstance(actual, int | float) and not isinstance(actual, bool)
            else _last_number(text)
        )
        if got is None:
            return _binary(False, f"no number in the answer {short(text, 80)}")
        tol = p.tolerance if p.mode == "numeric" else 0.0
        ok = math.isclose(got, want_num, rel_tol=p.rel_tolerance, abs_tol=tol) or got == want_num
        return _binary(ok, f"answer {got:g} vs expected {want_num:g} (tolerance {tol:g})")
    if isinstance(expected, str):
        a, b = text.strip(), expected.strip()
        ok = a == b if p.case_sensitive else a.casefold() == b.casefold()
        return _binary(ok, f"answer {short(a, 80)} {'==' if ok else '!='} {short(b, 80)}")
    # Structured expectation: the answer must be JSON equal to it.
    if isinstance(actual, str):
        try:
            actual = json.loads(actual)
        except json.JSONDecodeError:
            return _binary(False, f"answer is not JSON; expected {short(expected)}")
    ok = values_equal(expected, actual)
    return _binary(ok, f"answer {short(actual)} {'==' if ok else '!='} {short(expected)}")


def _rows_as(rows: list[Any], columns: list[str], like: list[Any]) -> list[Any]:
    """Shape actual rows like the expected ones: dicts by column name, or plain lists."""
    if like and isinstance(like[0], dict):
        return [dict(zip(columns, r, strict=False)) if isinstance(r, list) else r for r in rows]
    return rows


def _expected_rows(p: SqlResultMatchParams, ctx: ScoreContext) -> tuple[list[Any], str]:
    """The reference rows (given, or from the reference query: blocking, run it in a thread)."""
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    rows = p.rows if p.rows is not None else gt.get("rows")
    query = p.query or (gt.get("query") if rows is None else None)
    if rows is not None:
        return [r if isinstance(r, list | dict) else [r] for r in rows], "expected rows"
    if not query:
        raise ValueError("no reference: give params.query / params.rows or ground truth query/rows")
    if not isinstance(ctx.config, SqlConfig):
        raise ValueError("a reference query needs the sql template's config")

    conn = open_database(ctx.config)
    try:
        _, ref, _ = run_query(conn, query, ctx.config.query_timeout_seconds * 5, SUBMIT_ROW_CAP)
    finally:
        conn.close()
    return ref, "the reference query's rows"


def _one_value(rows: list[Any]) -> tuple[bool, Any]:
    """(True, value) when the rows are exactly one row of one column."""
    if len(rows) != 1:
        return False, None
    row = rows[0]
    values = list(row.values()) if isinstance(row, dict) else list(row)
    return (True, values[0]) if len(values) == 1 else (False, None)


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().replace(",", ""))
        except ValueError:
            return None
    return None


def _literal_matches(answer: Any, expected: Any) -> bool:
    """Numbers by value (`125` == `125.0` == `"125"`), strings trimmed, NULL as null."""
    if expected is None:
        return answer is None or (isinstance(answer, str) and answer.strip().upper() == "NULL")
    if isinstance(expected, int | float) and not isinstance(expected, bool):
        got = _as_number(answer)
        return got is not None and math.isclose(got, float(expected), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(expected, bytes):
        return False
    text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
    return text.strip() == str(expected).strip()


def _shape(rows: list[Any]) -> str:
    width = len(rows[0]) if rows and isinstance(rows[0], list | dict) else 0
    return f"{len(rows)} row(s) of {width} column(s)"


@register("sql_result_match", templates=("sql",))
async def sql_result_match(p: SqlResultMatchParams, ctx: ScoreContext) -> Outcome:
    """The submitted query's rows equal the reference rows (as a multiset unless order matters).

    A literal `answer` (no query) is compared with the reference when the reference is one
    value: numbers by value (`125` matches `125.0`), strings trimmed.
    """
    sub = ctx.state.get("submission")
    literal = isinstance(sub, dict) and "rows" not in sub and "answer" in sub
    if not isinstance(sub, dict) or ("rows" not in sub and not literal):
        return _binary(False, "nothing submitted (submit_answer with `query` or `answer`)")
    try:
        expected, what = await asyncio.to_thread(_expected_rows, p, ctx)
    except Exception as exc:  # a broken reference is the env author's bug: say so
        return _binary(False, f"reference failed: {exc}")
    if literal:
        single, value = _one_value(expected)
        answer = sub.get("answer")
        if not single:
            return _binary(
                False,
                f"a literal answer can only match a one-value result, but {what} are "
                f"{_shape(expected)}: submit the query instead",
            )
        ok = _literal_matches(answer, value)
        return _binary(
            ok, f"answer {short(answer, 80)} {'==' if ok else '!='} {short(value, 80)} ({what})"
        )
    actual = _rows_as(sub.get("rows") or [], sub.get("columns") or [], expected)
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    ordered = p.order_matters if p.order_matters is not None else bool(gt.get("orderMatters"))
    if ordered:
        ok = [canonical(r) for r in expected] == [canonical(r) for r in actual]
    else:
        ok = multiset_equal(expected, actual)
    mode = "in order" if ordered else "as a multiset"
    if ok:
        return _binary(True, f"{len(actual)} row(s) equal {what} {mode}")
    return _binary(
        False,
        f"rows differ from {what} {mode}: expected {short(normalise(expected))}, "
        f"got {short(normalise(actual))}",
    )


@register("tests_pass", templates=("code-editing",))
async def tests_pass(p: TestsPassParams, ctx: ScoreContext) -> Outcome:
    """The trusted tests pass on the final files, run in the sandbox, judged by their own results.

    With a pytest command (the default), the trusted tests (the hidden ones from the ground
    truth `tests` or params.files, plus the config's and the task's own test files as the author
    wrote them)
    run from a private read-only directory, never the work dir, under `python -I` with a pinned
    config, rootdir and plugin set, so none of the model's files (conftest.py, pytest.ini,
    pyproject.toml, setup.cfg, tox.ini, pytest.py, sitecustomize.py, .pth) has a say. It passes
    only when the JUnit report written to a private directory lists every test found by parsing
    the trusted files, each passed (skipped, xfailed and errors fail), the probe recorded that
    each body ran to its end with no tampering (pytest, builtins or tracing patched, asserts
    compiled out), and pytest exited 0. The exit code alone never passes.

    What remains possible: the module under test runs inside the test process, so code written
    against this exact harness could forge the records, and a value whose `__eq__` always
    returns True satisfies `assert add(2, 3) == 5` (tests should check types).

    A command that is not pytest keeps exit-code semantics: it runs in the work dir with the
    hidden files laid over the model's, and a model can forge its result; prefer pytest.
    """
    files = ctx.state.get("files")
    if not isinstance(files, dict):
        return _binary(False, "no files in the final state")
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    overlay = p.files if p.files is not None else gt.get("tests") or {}
    if not isinstance(overlay, dict):
        return _binary(False, "ground truth `tests` must map paths to contents")
    config = ctx.config if isinstance(ctx.config, CodeEditingConfig) else CodeEditingConfig()
    command = p.command or gt.get("testCommand") or config.test_command
    try:
        if is_pytest_command(test_command(command)):
            trusted = trusted_test_files({**config.files, **task_files(ctx.task)}, overlay)
            run = await run_hidden_tests(
                files,
                trusted,
                timeout_s=config.test_timeout_seconds,
                memory_mb=config.memory_mb,
            )
            return _binary(run.passed, run.reason)
        result = await run_tests_in_sandbox(
            {**files, **overlay},
            command,
            timeout_s=config.test_timeout_seconds,
            memory_mb=config.memory_mb,
        )
    except ToolError as exc:
        return _binary(False, f"cannot run tests: {exc}")
    except RolloutError as exc:  # SandboxUnavailable: never run unsandboxed
        raise InfraError(str(exc)) from None
    if result["passed"]:
        return _binary(True, f"tests passed in {result['durationS']}s (exit code of {command!r})")
    if result["timedOut"]:
        return _binary(False, "tests timed out")
    tail = (result["stdout"] + "\n" + result["stderr"]).strip().splitlines()[-3:]
    why = result["killedReason"] or f"exit code {result['exitCode']}"
    return _binary(False, f"tests failed ({why}): " + " | ".join(tail))


@register("url_reached", templates=("browser",))
def url_reached(p: UrlReachedParams, ctx: ScoreContext) -> Outcome:
    """The browser visited (or ended on) the URL."""
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    url = p.url or gt.get("url")
    if not url:
        return _binary(False, "no url to check (params.url or ground truth `url`)")
    state = ctx.state
    urls = [state.get("url")] if p.mode == "final" else list(state.get("history") or [])
    urls = [u for u in urls if isinstance(u, str)]

    def hit(u: str) -> bool:
        if p.match == "prefix":
            return u.startswith(url)
        if p.match == "regex":
            return re.search(url, u) is not None
        return u.rstrip("/") == url.rstrip("/")

    ok = any(hit(u) for u in urls)
    where = "final page" if p.mode == "final" else "visited pages"
    return _binary(ok, f"{url} {'in' if ok else 'not in'} {where} {short(urls, 100)}")


@register("form_submitted", templates=("browser",))
def form_submitted(p: FormSubmittedParams, ctx: ScoreContext) -> Outcome:
    """A form was submitted (at least minCount times) with the expected field values."""
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    form = p.form or gt.get("form")
    fields = p.fields if p.fields is not None else gt.get("fields")
    subs = [s for s in ctx.state.get("submissions") or [] if isinstance(s, dict)]
    matching = []
    for s in subs:
        if form and s.get("form") != form:
            continue
        values = s.get("values") or {}
        if fields and not all(
            k in values and (values_equal(v, values[k]) or str(v).strip() == str(values[k]).strip())
            for k, v in fields.items()
        ):
            continue
        matching.append(s)
    ok = len(matching) >= p.min_count
    what = (form or "any form") + (f" with {short(fields)}" if fields else "")
    return _binary(ok, f"{what}: {len(matching)} matching submission(s) of {len(subs)}")


@register("tool_call_order", tool_fields=("tools",))
def tool_call_order(p: ToolCallOrderParams, ctx: ScoreContext) -> Outcome:
    """The tools were called in this order (as a subsequence, or exactly with `exact`)."""
    names = [c.name for c in ctx.trajectory.tool_calls]
    if p.exact:
        ok = names == p.tools
    else:
        it = iter(names)
        ok = all(any(n == want for n in it) for want in p.tools)
    how = "exactly" if p.exact else "in order"
    return _binary(ok, f"{p.tools} {'called' if ok else 'not called'} {how}; calls: {names}")
