"""Plan-time validation: every problem in an environment, each naming its config path.

`validate_environment(env)` never raises on bad input: fuzzed or half-written specs come back as
a list of `path: message` strings (e.g. `config.tools[1].fromArray: no fixture 'orderz'`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Collection
from typing import Any

from pydantic import ValidationError

from rollout.shared.contracts.envspec import (
    EnvironmentSpec,
    PrimitiveSpec,
    TaskSpec,
    VerifierSpec,
)
from rollout.shared.envs.checks import duplicates as _duplicates
from rollout.shared.envs.coerce import as_spec, loc_path, pydantic_problems, raw_environment
from rollout.shared.envs.paths import PathError, format_path, parse_path
from rollout.shared.envs.splits import ids_matter, split_check
from rollout.shared.envs.templates import REGISTRY, canonical_name
from rollout.shared.envs.verifiers import REGISTRY as PRIMITIVES
from rollout.shared.envs.verifiers import known_types
from rollout.shared.envs.verifiers.engine import default_verifier
from rollout.shared.errors import RolloutError
from rollout.shared.jsondepth import MAX_DEPTH


class _Problems(list):
    """A list of problems that can run a check and turn a crash into a problem."""

    def guard(self, where: str, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception as exc:  # validation must report, never crash
            self.append(f"{where}: could not be checked ({type(exc).__name__}: {exc})")


def validate_environment(env_or_spec: Any) -> list[str]:
    """Every problem in an environment (empty list when it is valid)."""
    problems = _Problems()
    try:
        raw = raw_environment(env_or_spec)
    except RolloutError as exc:
        return [str(exc)]
    except Exception as exc:
        return [f"<root>: cannot read the environment ({type(exc).__name__}: {exc})"]
    if not isinstance(raw, dict):
        return [f"<root>: must be an object, got {type(raw).__name__}"]
    if deep := _too_deep(raw):
        # Every other check walks the spec recursively, and no service could store it (JSON
        # writers stop near 255 levels): only where it is too deep is said.
        return deep
    try:
        EnvironmentSpec.model_validate(raw)
    except ValidationError as exc:
        problems.extend(_one_for_many(raw, pydantic_problems(exc)))

    carried = {key: _non_json(raw.get(key), key) for key in ("config", "tasks", "verifier")}
    for found_here in carried.values():
        problems.extend(found_here)
    for key, value in raw.items():
        if key not in ("config", "tasks", "verifier") and isinstance(value, str):
            if (problem := _text_problem(value)) is not None:
                problems.append(f"{key}: {problem}")

    template = raw.get("template")
    if isinstance(template, str):
        template = canonical_name(template)
    # No config is the empty one (the spec's default): its template's required keys are missing.
    config_raw = raw.get("config", {})
    config: Any = None
    tools: list[str] | None = None
    kind = REGISTRY.get(template) if isinstance(template, str) else None
    if isinstance(template, str) and kind is None:
        problems.append(f"template: unknown template {template!r} (known: {', '.join(REGISTRY)})")
    elif kind is not None and isinstance(config_raw, dict):
        try:
            config = kind.config_model.model_validate(config_raw)
        except ValidationError as exc:
            problems.extend(pydantic_problems(exc, "config"))
        if config is not None:
            found: list[str] = []
            problems.guard("config", lambda: kind.check_config(config, found))
            problems.extend(found)
            # A config JSON cannot carry (a lone surrogate in a plugin's source) cannot be
            # sent to the plugin host that lists its tools: said above, not asked.
            if not carried["config"]:
                tools = _plan_tools(kind, config, problems)

    tasks = _tasks(raw.get("tasks"), problems)
    verifier = _verifier(raw.get("verifier"))
    if verifier is not None and isinstance(template, str):
        problems.guard("verifier", lambda: _check_verifier(verifier, template, tools, problems))
    if kind is not None:
        problems.guard(
            "tasks", lambda: _check_tasks(tasks, template, config, verifier, raw, problems)
        )
    # Splits a run could never select, and held-out tasks that are train tasks again.
    by_id = ids_matter(template)
    problems.guard(
        "tasks", lambda: problems.extend(split_check([t for _, t in tasks], ids_matter=by_id)[0])
    )
    return list(dict.fromkeys(problems))  # same problem found twice is listed once


# ---------------------------------------------------------------- helpers


def _plan_tools(kind: Any, config: Any, problems: _Problems) -> list[str] | None:
    """The template's tools at plan time; a crash in asking is a problem, never a traceback."""
    tools: list[list[str] | None] = [None]

    def ask() -> None:
        tools[0] = kind.plan_tools(config, problems)

    problems.guard("config", ask)
    return tools[0]


# Levels of lists and objects a spec may nest, from its root: far more than any config needs,
# far under the interpreter's recursion limit and the JSON writers' (about 255).
MAX_SPEC_DEPTH = MAX_DEPTH


def _too_deep(raw: dict[str, Any], limit: int = MAX_SPEC_DEPTH, most: int = 5) -> list[str]:
    """Where `raw` nests lists and objects past `limit` levels (walked without recursion)."""
    found: list[str] = []
    stack: list[tuple[Any, list[Any]]] = [(raw, [])]
    while stack and len(found) < most:
        node, segs = stack.pop()
        if not isinstance(node, dict | list | tuple):
            continue
        if len(segs) >= limit:
            found.append(
                f"{format_path(segs)}: nested deeper than {limit} levels of lists and objects "
                "(a spec is JSON that services store and read back: flatten it)"
            )
            continue
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((v, [*segs, k if isinstance(k, int | str) else repr(k)]) for k, v in items)
    return found


def unsendable(raw: Any) -> list[str]:
    """What a spec cannot be sent as (a request's JSON): lists and objects nested too deep (no
    JSON writer takes them) and NaN or infinite numbers (sent, they would arrive as null)."""
    if not isinstance(raw, dict):
        return []
    if deep := _too_deep(raw):
        return deep
    found: list[str] = []
    stack: list[tuple[Any, list[Any]]] = [(v, [k]) for k, v in raw.items() if isinstance(k, str)]
    while stack and len(found) < 5:
        node, segs = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, [*segs, k]) for k, v in node.items() if isinstance(k, str))
        elif isinstance(node, list | tuple):
            stack.extend((v, [*segs, i]) for i, v in enumerate(node))
        elif isinstance(node, float) and not math.isfinite(node):
            found.append(
                f"{format_path(segs)}: {node} is not a finite number (JSON has no NaN or inf)"
            )
    return found


_JSON_SCALARS = (str, int, float, bool, type(None))


def _text_problem(text: str) -> str | None:
    """Why `text` cannot be stored: a NUL (Postgres text and jsonb cannot hold one) or a lone
    surrogate (not UTF-8: no service could read the spec)."""
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains {text[exc.start]!r} at position {exc.start}, which is not UTF-8 text"
    return None


def _non_json(value: Any, where: str, limit: int = 5) -> list[str]:
    """Paths holding values JSON cannot carry (specs travel as JSON to services and stores)."""
    found: list[str] = []
    stack: list[tuple[Any, list[Any]]] = [(value, [where])]
    while stack and len(found) < limit:
        node, segs = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    found.append(f"{format_path(segs)}: key {k!r} is not a string")
                    continue
                if (problem := _text_problem(k)) is not None:
                    found.append(f"{format_path(segs)}: key {k!r} {problem}")
                    continue
                stack.append((v, [*segs, k]))
        elif isinstance(node, list | tuple):
            stack.extend((v, [*segs, i]) for i, v in enumerate(node))
        elif isinstance(node, str) and (problem := _text_problem(node)) is not None:
            found.append(f"{format_path(segs)}: {problem}")
        elif isinstance(node, float) and not math.isfinite(node):
            found.append(
                f"{format_path(segs)}: {node} is not a finite number (JSON has no NaN or inf)"
            )
        elif hasattr(node, "model_dump"):
            # pydantic models (Task, specs) are dumped to JSON by the SDK: what they hold is
            # checked as that JSON (a NaN in a ground truth would be stored as null).
            try:
                stack.append((node.model_dump(by_alias=True), segs))
            except Exception:  # noqa: BLE001 - its own validation names what is wrong
                continue
        elif not isinstance(node, _JSON_SCALARS):
            kind = type(node).__name__
            found.append(f"{format_path(segs)}: {kind} is not JSON (use str, number, list, dict)")
    return found


# ---------------------------------------------------------------- tasks and verifier


def _one_for_many(raw: dict[str, Any], problems: list[str]) -> list[str]:
    """A lone primitive given as the verifier, or a lone task as the tasks, said as that: not
    as its keys being unknown to a verifier, nor as "Input should be a valid list"."""
    verifier, tasks = raw.get("verifier"), raw.get("tasks")
    if isinstance(verifier, dict) and "primitives" not in verifier and "type" in verifier:
        problems = [p for p in problems if not p.startswith("verifier.")]
        problems.append(
            "verifier: one primitive, not a verifier: give a list of primitives "
            "(verifier_config(primitive(...)) or [primitive(...)])"
        )
    if isinstance(tasks, TaskSpec) or (isinstance(tasks, dict) and "instruction" in tasks):
        # pydantic read a Task's fields as the items of a list: tasks[0]..tasks[6] are those.
        problems = [p for p in problems if not p.startswith(("tasks:", "tasks["))]
        problems.append("tasks: one task, not a list of them (tasks=[Task(...)])")
    return problems


def _tasks(raw_tasks: Any, problems: _Problems) -> list[tuple[int, TaskSpec]]:
    if raw_tasks is None or raw_tasks == []:
        problems.append("tasks: no tasks (add at least one Task)")
        return []
    if not isinstance(raw_tasks, list):
        return []
    parsed = []
    for i, raw in enumerate(raw_tasks):
        try:
            parsed.append((i, TaskSpec.model_validate(raw)))
        except ValidationError:
            continue  # already reported by the whole-spec validation
    return parsed


def _verifier(raw: Any) -> VerifierSpec | None:
    if raw is None:
        return None
    try:
        return VerifierSpec.model_validate(raw)
    except ValidationError:
        return None  # already reported by the whole-spec validation


def _check_verifier(
    verifier: VerifierSpec, template: str, tools: list[str] | None, out: list[str]
) -> None:
    if not verifier.primitives:
        out.append("verifier.primitives: empty (remove the verifier to use the default)")
        return
    _duplicates(
        [p.name for p in verifier.primitives],
        lambda i: f"verifier.primitives[{i}].name",
        "primitive name",
        out,
    )
    if all(p.weight == 0 for p in verifier.primitives):
        out.append("verifier.primitives: every weight is 0")
    for i, prim in enumerate(verifier.primitives):
        where = f"verifier.primitives[{i}]"
        definition = PRIMITIVES.get(prim.type)
        if definition is None:
            out.append(
                f"{where}.type: unknown primitive {prim.type!r} (known: {', '.join(known_types())})"
            )
            continue
        if definition.templates and template not in definition.templates:
            out.append(
                f"{where}.type: {prim.type} works with the {'/'.join(definition.templates)} "
                f"template, not {template}"
            )
        try:
            params = definition.params.model_validate(prim.params)
        except ValidationError as exc:
            out.extend(pydantic_problems(exc, where))
            continue
        if definition.check is not None:
            out.extend(f"{where}.{key}: {problem}" for key, problem in definition.check(params))
        if tools is None:
            continue
        for field in definition.tool_fields:
            value = getattr(params, field)
            names = [value] if isinstance(value, str) else list(value or [])
            key = definition.params.model_fields[field].alias or field
            for name in names:
                if name not in tools:
                    known = ", ".join(tools) or "none"
                    out.append(f"{where}.{key}: unknown tool {name!r} (tools: {known})")


def _check_tasks(
    tasks: list[tuple[int, TaskSpec]],
    template: str,
    config: Any,
    verifier: VerifierSpec | None,
    raw: dict[str, Any],
    out: list[str],
) -> None:
    ids = [(i, t.id) for i, t in tasks if t.id]
    _duplicates([tid for _, tid in ids], lambda k: f"tasks[{ids[k][0]}].id", "task id", out)
    kind = REGISTRY[template]
    roots = kind.state_roots(config)
    truth: list[tuple[str, str]] = []  # (ground-truth path, problem) seen by its primitives
    for i, task in tasks:
        where = f"tasks[{i}]"
        if not task.instruction.strip():
            out.append(f"{where}.instruction: empty")
        gt = task.hidden_ground_truth
        if verifier is not None and verifier.primitives:
            _check_truth(verifier.primitives, gt, where, truth)
        else:
            slim = EnvironmentSpec.model_construct(template=template, slug=str(raw.get("slug")))
            prims = default_verifier(slim, task).primitives
            _check_truth(prims, gt, where, truth)
            if prims[0].type in ("env_reward", "verifiers_rubric"):
                continue  # the remote environment rewards the episode: no ground truth needed
            if gt is None:
                out.append(
                    f"{where}.hiddenGroundTruth: missing; the default verifier "
                    f"({prims[0].type}) compares against it"
                )
                continue
            # A lone state_match with no `expected` of its own compares the ground truth as state.
            lone = len(prims) == 1 and prims[0].type == "state_match"
            if lone and prims[0].params.get("expected") is None:
                if not isinstance(gt, dict):
                    out.append(
                        f"{where}.hiddenGroundTruth: must be an object of state paths for the "
                        f"default state_match verifier"
                    )
                elif roots is not None:
                    # A typo of a key the template reads ("qury") made this a state_match.
                    read = kind.ground_truth_keys() or set()
                    for key in gt:
                        first = _first_segment(key)
                        if first is not None and first not in roots:
                            out.append(
                                f"{_truth_key(where, key)}: not in the environment's state "
                                f"(state keys: {_known(roots, first, read)})"
                            )
            elif isinstance(gt, dict) and (read := kind.ground_truth_keys()) is not None:
                # A misspelt key ("tsts") would be ignored: its tests never run, yet rollouts pass.
                for key in gt:
                    if key not in read:
                        out.append(
                            f"{loc_path([key], f'{where}.hiddenGroundTruth')}: not read by the "
                            f"{template} template's "
                            f"default verifier (it reads: {_known(read, key)})"
                        )
        if config is not None:
            kind.check_task(config, task, where, out)
    # A value the template's own check already refused is not said again in the param's words.
    for at, problem in truth:
        if not any(o.startswith((f"{at}:", f"{at}.", f"{at}[")) for o in out):
            out.append(problem)


def _check_truth(
    prims: list[PrimitiveSpec], gt: Any, where: str, out: list[tuple[str, str]]
) -> None:
    """Ground-truth values a primitive reads in place of its own unset param, checked as that
    param: a wrong type would pass plan and crash every score of the task."""
    if not isinstance(gt, dict):
        return
    for prim in prims:
        definition = PRIMITIVES.get(prim.type)
        if definition is None:
            continue
        own = prim.params
        for key, field in definition.truth_fields.items():
            alias = definition.params.model_fields[field].alias or field
            if gt.get(key) is None or own.get(alias):
                continue  # not given, or the primitive's own param is used instead
            at = f"{where}.hiddenGroundTruth.{key}"
            try:
                params = definition.params.model_validate({**own, alias: gt[key]})
            except ValidationError as exc:
                for problem in pydantic_problems(exc):
                    if problem.startswith((f"{alias}:", f"{alias}.", f"{alias}[")):
                        out.append((at, at + problem[len(alias) :]))
                continue
            if definition.check is not None:
                checked = definition.check(params)
                out.extend((at, f"{at}: {why}") for name, why in checked if name == alias)


def _truth_key(where: str, key: Any) -> str:
    """The path of a ground-truth key: as written (it may be a state path, `orders[0].id`),
    quoted where it would not read as one (empty, blank, a NUL)."""
    text = str(key)
    if text.strip() and text.isprintable() and not any(c.isspace() for c in text):
        return f"{where}.hiddenGroundTruth.{text}"
    return loc_path([text], f"{where}.hiddenGroundTruth")


def _known(names: set[str], given: str, also: Collection[str] = ()) -> str:
    """`names` listed, with the closest to `given` of them or of `also` suggested (a typo is
    the usual cause)."""
    listed = ", ".join(sorted(names)) or "none"
    close = difflib.get_close_matches(given, sorted(names | set(also)), n=1)
    return f"{listed}; did you mean {close[0]!r}?" if close else listed


def _first_segment(key: Any) -> str | None:
    if not isinstance(key, str):
        return None
    try:
        first = parse_path(key)[0]
    except PathError:
        return key
    return first if isinstance(first, str) else None


def check_or_raise(env_or_spec: Any) -> EnvironmentSpec:
    """Validate and return the spec; RolloutError listing every problem otherwise."""
    problems = validate_environment(env_or_spec)
    if problems:
        raw = raw_environment(env_or_spec)
        slug = raw.get("slug") if isinstance(raw, dict) else None
        raise RolloutError(
            f"environment {slug!r} has {len(problems)} problem(s)", problems=problems
        )

    return as_spec(env_or_spec)
