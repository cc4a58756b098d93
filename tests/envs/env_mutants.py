"""Mutated environment specs and what a mutant must get: acceptance, or problems by path.

`mutants(seed, n)` yields (label, raw spec) pairs: each example env's spec (as `rollout push`
sends it) with one to three mistakes a user makes (a dropped field, a wrong type or enum, an
empty, huge or odd string, a duplicate task id, a tool that does not exist, a verifier param
out of range, an overlapping split, a budget below zero, NaN, a path out of the work dir...).

`judge(raw)` validates one as `rollout plan` and `rollout push` do (`validate_environment`, then
a plugin's episodes started) and returns what is wrong with the answer (an empty list when it
is right): a crash, a problem naming no field path, or a spec accepted that then fails when an
episode starts, a tool runs (the example's scripted plan, then each tool) or the verifier
scores.
Used by tests/envs/test_env_fuzz.py (a few hundred) and benchmarks/env_fuzz.py (thousands).
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import random
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import structlog

from rollout.environment import Environment
from rollout.errors import RolloutError
from rollout.shared.contracts.envspec import EnvironmentSpec
from rollout.shared.contracts.trajectory import ToolCallRecord, Trajectory
from rollout.shared.envs import build_runtime, load_environments, score, validate_environment
from rollout.shared.envs.coerce import as_spec, raw_environment
from rollout.shared.envs.starts import start_problems
from rollout.shared.envs.verifiers import REGISTRY as PRIMITIVES
from rollout.shared.learning.scripted import plan_for

ROOT = Path(__file__).resolve().parents[2]
TOP_KEYS = ("slug", "name", "template", "description", "config", "tasks", "verifier", "budgets")
# Tasks kept per example: enough for duplicates and splits, few enough to score quickly.
TASKS_KEPT = 4


@cache
def examples() -> tuple[dict[str, Any], ...]:
    """Every example env's spec as pushed (a plugin carries its own sources)."""
    raws = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        for env in load_environments(path):
            raw = raw_environment(env)
            raw["tasks"] = raw["tasks"][:TASKS_KEPT]
            raws.append(raw)
    return tuple(raws)


# ------------------------------------------------------------------ where to mutate


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if len(prefix) > 30:  # inside a deep_nesting mutant: nothing more to find there
        return out
    if isinstance(value, dict):
        for key, inner in value.items():
            out.extend(_paths(inner, (*prefix, key)))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            out.extend(_paths(inner, (*prefix, i)))
    return out


def _get(root: Any, path: tuple) -> Any:
    for key in path:
        root = root[key]
    return root


def _set(root: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    _get(root, path[:-1])[path[-1]] = new
    return root


def _leaves(raw: dict[str, Any], kind: type | tuple[type, ...]) -> list[tuple]:
    return [
        p
        for p in _paths(raw)
        if p and isinstance(_get(raw, p), kind) and not isinstance(_get(raw, p), bool)
    ]


def _primitives(raw: dict[str, Any]) -> list[dict[str, Any]]:
    verifier = raw.get("verifier")
    prims = verifier.get("primitives") if isinstance(verifier, dict) else verifier
    return [p for p in prims if isinstance(p, dict)] if isinstance(prims, list) else []


def _tasks(raw: dict[str, Any]) -> list[dict[str, Any]]:
    tasks = raw.get("tasks")
    return [t for t in tasks if isinstance(t, dict)] if isinstance(tasks, list) else []


# ------------------------------------------------------------------ values a user gets wrong

ODD_TEXT = [
    "",
    " ",
    "x" * 100_000,
    "ünïcödé ✓ 🚀",
    "\u202eevil",
    "e\u0301\u0301\u0301",
    "\x00",
    "a\ud800b",
    "../../etc/passwd",
    "/etc/passwd",
    "${args.nope}",
    "${",
    "NaN",
    "-1",
    "\n\t",
    "([unclosed",
]
ODD_NUMBERS = [
    -1,
    0,
    -0.0,
    1e308,
    10**30,
    -(10**30),
    float("nan"),
    float("inf"),
    float("-inf"),
    0.5,
    2**63,
    True,
]
ODD_ANY = [*ODD_TEXT, *ODD_NUMBERS, None, [], {}, [None], {"": None}, [[[]]], {"a": {"b": [1]}}]


def _deep(depth: int) -> Any:
    node: Any = "leaf"
    for i in range(depth):
        node = {"k": node} if i % 2 else [node]
    return node


# ------------------------------------------------------------------ mutations

Mutation = Callable[[dict[str, Any], random.Random], bool]


def drop_field(raw: dict[str, Any], rng: random.Random) -> bool:
    """Remove a key anywhere (a required one, often)."""
    keyed = [p for p in _paths(raw) if p and isinstance(p[-1], str)]
    path = rng.choice(keyed)
    del _get(raw, path[:-1])[path[-1]]
    return True


def wrong_type(raw: dict[str, Any], rng: random.Random) -> bool:
    """A value of another JSON type in the place of one."""
    path = rng.choice([p for p in _paths(raw) if p])
    old = _get(raw, path)
    choices: list[Any] = [1, "1", [old], {"value": old}, None, True, 2.5]
    _set(raw, path, rng.choice([c for c in choices if type(c) is not type(old)]))
    return True


def odd_string(raw: dict[str, Any], rng: random.Random) -> bool:
    """An empty, blank, huge, non-UTF-8, NUL, unicode or path-like string in a string's place."""
    strings = _leaves(raw, str)
    if not strings:
        return False
    _set(raw, rng.choice(strings), rng.choice(ODD_TEXT))
    return True


def odd_number(raw: dict[str, Any], rng: random.Random) -> bool:
    """A negative, zero, huge, NaN or infinite number in a number's place."""
    numbers = _leaves(raw, int | float)
    if not numbers:
        return False
    _set(raw, rng.choice(numbers), rng.choice(ODD_NUMBERS))
    return True


def odd_key(raw: dict[str, Any], rng: random.Random) -> bool:
    """A misspelt, empty, unicode or NUL key added to an object."""
    objects = [p for p in _paths(raw) if isinstance(_get(raw, p), dict)]
    node = _get(raw, rng.choice(objects))
    node[rng.choice(["", "\x00", "tsts", "instrucion", "ключ", "a.b", "[0]", "x" * 300])] = 1
    return True


def deep_nesting(raw: dict[str, Any], rng: random.Random) -> bool:
    """A value nested hundreds (or a thousand) deep."""
    path = rng.choice([p for p in _paths(raw) if p])
    _set(raw, path, _deep(rng.choice([50, 300, 1500])))
    return True


def any_value(raw: dict[str, Any], rng: random.Random) -> bool:
    """Any odd value anywhere."""
    path = rng.choice([p for p in _paths(raw) if p])
    _set(raw, path, copy.deepcopy(rng.choice(ODD_ANY)))
    return True


def wrong_enum(raw: dict[str, Any], rng: random.Random) -> bool:
    """A template, primitive type, split, mode or isolation that does not exist."""
    choices: list[tuple] = [("template",)]
    choices += [("tasks", i, "split") for i, _ in enumerate(_tasks(raw))]
    for i in range(len(_primitives(raw))):
        choices.append(("verifier", "primitives", i, "type"))
        choices += [("verifier", "primitives", i, k) for k in ("mode", "match", "source")]
    config = raw.get("config")
    if isinstance(config, dict):
        choices += [("config", k) for k in ("testIsolation", "initialUrl") if k in config]
    path = rng.choice(choices)
    try:
        _set(raw, path, rng.choice(["nope", "Train", "TEST", "state-match", "", "worflow"]))
    except (KeyError, IndexError, TypeError):
        return False
    return True


def duplicate_task_id(raw: dict[str, Any], rng: random.Random) -> bool:
    """Two tasks with one id (or one instruction under two splits)."""
    tasks = _tasks(raw)
    if len(tasks) < 2:
        return False
    a, b = rng.sample(tasks, 2)
    if rng.random() < 0.5:
        a["id"] = b["id"] = b.get("id") or "same"
    else:  # the same task in train and test: a held-out task that is a train task again
        a.update(copy.deepcopy({k: v for k, v in b.items() if k != "split"}))
        a["split"], b["split"] = "train", "test"
    return True


def overlapping_splits(raw: dict[str, Any], rng: random.Random) -> bool:
    """Every task held out, none to train on; or splits named like the standard ones."""
    tasks = _tasks(raw)
    if not tasks:
        return False
    split = rng.choice(["test", "validation", "heldout", "eval", "Train", " train", "train "])
    for task in tasks:
        task["split"] = split
    return True


def missing_tool(raw: dict[str, Any], rng: random.Random) -> bool:
    """A verifier (or a tool's reference) naming a tool or fixture that does not exist."""
    prims = _primitives(raw)
    if prims and rng.random() < 0.6:
        prim = rng.choice(prims)
        prim.clear()
        kind = rng.choice(["tool_was_called", "tool_call_order", "no_tool_errors"])
        prim.update(name="ghost", type=kind)
        if kind == "tool_was_called":
            prim["tool"] = "no_such_tool"
        else:
            prim["tools"] = ["no_such_tool"]
        return True
    config = raw.get("config")
    tools = config.get("tools") if isinstance(config, dict) else None
    if isinstance(tools, list) and tools and isinstance(tools[0], dict):
        tool = rng.choice(tools)
        key = rng.choice(["fromArray", "name", "kind", "key"])
        tool[key] = rng.choice(["no_such_fixture", "", "../x", 3])
        return True
    return False


def bad_primitive_param(raw: dict[str, Any], rng: random.Random) -> bool:
    """A verifier primitive's own param with a wrong value (or an unknown param)."""
    prims = _primitives(raw)
    if not prims:
        raw["verifier"] = {"primitives": [{"name": "p", "type": rng.choice(list(PRIMITIVES))}]}
        prims = _primitives(raw)
    prim = rng.choice(prims)
    if rng.random() < 0.3:  # another type with this one's params
        prim["type"] = rng.choice(list(PRIMITIVES))
        return True
    definition = PRIMITIVES.get(str(prim.get("type")))
    keys = [f.alias or n for n, f in definition.params.model_fields.items()] if definition else []
    key = rng.choice([*keys, "weight", "name", "unknownParam"])
    bad: list[Any] = [
        *ODD_NUMBERS,
        "",
        "([",
        "(a+)+$",
        "x" * 10_000,
        [],
        {},
        [1, "a"],
        {"": 1},
        ["../../etc/passwd"],
        {"../evil.py": "x"},
        "rm -rf /",
        None,
    ]
    prim[key] = copy.deepcopy(rng.choice(bad))
    return True


def bad_template_config(raw: dict[str, Any], rng: random.Random) -> bool:
    """A template config value out of range or of the wrong kind."""
    config = raw.get("config")
    if not isinstance(config, dict):
        return False
    bad_by_key: dict[str, list[Any]] = {
        "testTimeoutSeconds": [0, -5, 1e9, float("nan"), "10"],
        "memoryMb": [0, -1, 10**9, 1.5],
        "testCommand": ["", [], ["no-such-binary-xyz"], "pytest; rm -rf /", [1, 2]],
        "testIsolation": ["none", "", None],
        "files": [{"../escape.py": "x"}, {"/abs.py": "x"}, {"": "x"}, {"a/../../b": "x"}, []],
        "schema": ["CREATE TABLE (", "", "DROP TABLE x;", "CREATE TABLE t(a);" * 5000],
        "seed": ["INSERT INTO nowhere VALUES (1);", "ATTACH DATABASE '/tmp/x' AS y;", ""],
        "maxRows": [0, -1, 10**12],
        "queryTimeoutSeconds": [0, -1, float("inf")],
        "pages": [{}, [], {"not-a-url": {}}, {"/": {"forms": "x"}}, {"/": None}],
        "initialUrl": ["", "file:///etc/passwd", "http://169.254.169.254/", "/nowhere"],
        "entrypoint": ["", "nomodule", "x:y", "../../etc:passwd", "os:system"],
        "sources": [{}, {"../x.py": "x"}, {"m.py": "def ("}, []],
        "options": [[], "x", {"k": float("nan")}],
        "fixtures": [{"": []}, [], {"orders": "x"}, {"orders": [1, 2]}],
        "initialMutableState": [[], "x", {"": 1}],
        "tools": [[], {}, [{}], [{"name": "t"}], [{"name": "t", "kind": "nope"}]],
    }
    keys = [k for k in config if k in bad_by_key] or list(bad_by_key)
    key = rng.choice(keys)
    config[key] = copy.deepcopy(rng.choice(bad_by_key[key]))
    return True


def escaping_path(raw: dict[str, Any], rng: random.Random) -> bool:
    """A path out of the work dir: a file, a plugin source, a ground-truth file, a JSONL."""
    escapes = ["../x.py", "../../etc/passwd", "/etc/passwd", "a/../../x", "~/x", "./../x", "C:\\x"]
    config = raw.get("config")
    targets: list[tuple[Any, str]] = []
    if isinstance(config, dict):
        for key in ("files", "sources"):
            if isinstance(config.get(key), dict):
                targets.append((config[key], key))
    for task in _tasks(raw):
        gt = task.get("hiddenGroundTruth")
        for key in ("files", "tests"):
            if isinstance(gt, dict) and isinstance(gt.get(key), dict):
                targets.append((gt[key], key))
    for prim in _primitives(raw):
        if isinstance(prim.get("files"), dict):
            targets.append((prim["files"], "files"))
    if not targets:
        return False
    table, _ = rng.choice(targets)
    table[rng.choice(escapes)] = "print('escaped')\n"
    return True


def bad_budgets(raw: dict[str, Any], rng: random.Random) -> bool:
    """Env budgets below zero, zero, huge, NaN, of the wrong type or misspelt."""
    names = ["maxTurnTokens", "maxRolloutTokens", "maxRolloutSeconds", "maxRepeatedCalls"]
    budgets = raw.get("budgets") if isinstance(raw.get("budgets"), dict) else {}
    key = rng.choice([*names, "max_turn_tokens", "maxTurnTokenz", "turns"])
    budgets[key] = rng.choice([-1, 0, 10**15, float("nan"), float("inf"), "10", 1.5, None, []])
    raw["budgets"] = budgets if rng.random() < 0.9 else rng.choice([[], "x", 5])
    return True


def bad_ground_truth(raw: dict[str, Any], rng: random.Random) -> bool:
    """A hidden ground truth of the wrong shape, with a typo'd key, or missing."""
    tasks = _tasks(raw)
    if not tasks:
        return False
    task = rng.choice(tasks)
    task["hiddenGroundTruth"] = copy.deepcopy(
        rng.choice(
            [
                None,
                "x",
                3,
                [],
                {},
                {"qury": "SELECT 1"},
                {"tsts": {}},
                {"nope.path": 1},
                {"files": "x"},
                {"tests": {"t.py": "def ("}},
                {"query": "SELEC nothing"},
                {"rows": "x"},
                {"finalUrl": 3},
                {"answer": float("nan")},
            ]
        )  # fmt: skip
    )
    return True


def many_tasks(raw: dict[str, Any], rng: random.Random) -> bool:
    """Tasks that are no list, empty, or full of non-objects."""
    raw["tasks"] = copy.deepcopy(rng.choice([[], {}, "tasks", [None], [[]], [{}], [1, 2]]))
    return True


MUTATIONS: dict[str, Mutation] = {
    f.__name__: f
    for f in (
        drop_field,
        wrong_type,
        odd_string,
        odd_number,
        odd_key,
        deep_nesting,
        any_value,
        wrong_enum,
        duplicate_task_id,
        overlapping_splits,
        missing_tool,
        bad_primitive_param,
        bad_template_config,
        escaping_path,
        bad_budgets,
        bad_ground_truth,
        many_tasks,
    )
}


def mutants(seed: int, n: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """`n` mutants, the same for the same seed: (the mutations' names, the raw spec)."""
    rng = random.Random(seed)
    pool = examples()
    names = list(MUTATIONS)
    made = 0
    while made < n:
        raw = copy.deepcopy(pool[made % len(pool)])
        applied = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            name = rng.choice(names)
            if MUTATIONS[name](raw, rng):
                applied.append(name)
        if applied:
            made += 1
            slug = raw.get("slug") if isinstance(raw, dict) else None
            yield f"{slug if isinstance(slug, str) else '?'}:{'+'.join(applied)}", raw


# ------------------------------------------------------------------ what a mutant must get

# A problem names where it is: a top-level key, then `.key` or `[i]` steps, then ": why".
_STEP = r'\[(?:\d+|"(?:[^"\\]|\\.)*")\]'
_PATH = re.compile(rf"^(<root>|[^\W\d][\w-]*|{_STEP})(\.[^\s:.\[]+|{_STEP})*: \S")
_GENERIC = ("internal error", "Traceback", "could not be checked", "cannot read the environment")


def problem_faults(problems: Any, raw: Any) -> list[str]:
    """What is wrong with a list of problems: not strings, no path, a crash said as one."""
    if not isinstance(problems, list) or not all(isinstance(p, str) and p for p in problems):
        return [f"problems are not a list of strings: {problems!r:.200}"]
    faults = []
    tops = set(TOP_KEYS) | (set(raw) if isinstance(raw, dict) else set())
    for p in problems:
        if any(g in p for g in _GENERIC):
            faults.append(f"generic or crash problem: {p[:300]}")
        head = _PATH.match(p)
        first = re.split(r"[.\[:]", p, maxsplit=1)[0]
        if head is None or (first not in tops and first not in ("<root>", "")):
            faults.append(f"problem names no field path: {p[:300]}")
    return faults


def _argument(schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = kind[0] if kind else None
    return {"string": "O-1001", "integer": 1, "number": 1.0, "boolean": True, "array": [],
            "object": {}}.get(kind, "x")  # fmt: skip


def _arguments(parameters: Any) -> dict[str, Any]:
    props = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
    return {name: _argument(schema) for name, schema in props.items()}


def _planned(spec: EnvironmentSpec, index: int, runtime: Any) -> list[tuple[str, Any]]:
    try:
        return list(plan_for(spec, spec.tasks[index], runtime) or [])
    except Exception:  # noqa: BLE001 - a planner reading a mutated ground truth: no plan
        return []


async def _episode(spec: EnvironmentSpec, index: int, faults: list[str], tests: bool) -> None:
    try:
        runtime = build_runtime(spec, index)
    except RolloutError as exc:
        faults.append(f"accepted, but tasks[{index}] cannot start: {exc.message[:300]}")
        return
    records = []
    try:
        # The scripted plan that solves the example (submissions, files, refunds in the state
        # the verifier reads), then each tool once with plain arguments.
        calls = _planned(spec, index, runtime)
        calls += [(t.name, _arguments(t.parameters)) for t in runtime.tool_specs()[:8]]
        for i, (name, args) in enumerate(calls):
            if name == "run_tests" and not tests:
                continue  # the sandbox: only where the caller pays for it
            result = await runtime.call_tool(name, args)
            records.append(
                ToolCallRecord(
                    index=i,
                    name=name,
                    arguments=args,
                    result=result.output,
                    error=result.error,
                )  # fmt: skip
            )
        state = runtime.final_state()
    finally:
        await runtime.close()
    if spec.template == "code-editing" and not tests:
        return  # tests_pass runs the sandbox
    trajectory = Trajectory(tool_calls=records, final_output="42", final_state=state)
    result = await score(spec, index, trajectory)
    for prim in result.primitives:
        reason = prim.reason or ""
        if reason.startswith(("error:", "invalid params", "unknown primitive")):
            faults.append(f"accepted, but {prim.name} ({prim.type}) fails scoring: {reason[:300]}")
    if not math.isfinite(result.score):
        faults.append(f"accepted, but the score is {result.score}")


def judge(raw: Any, *, run: bool = True, tests: bool = False) -> tuple[bool, list[str], list[str]]:
    """(accepted, problems, faults): faults empty when the answer is right."""
    faults: list[str] = []
    with structlog.testing.capture_logs() as events:
        try:
            problems = validate_environment(raw)
        except Exception as exc:  # noqa: BLE001 - the fuzzer's finding
            return False, [], [f"validate_environment raised {type(exc).__name__}: {exc}"[:400]]
        if not problems:  # as plan and push: a plugin whose episodes cannot start is refused
            try:
                problems = start_problems(as_spec(raw))
            except Exception as exc:  # noqa: BLE001 - the fuzzer's finding
                faults.append(f"start_problems raised {type(exc).__name__}: {exc}"[:400])
        faults += problem_faults(problems, raw)
        if not problems:
            faults += _accepted_faults(raw, run=run, tests=tests)
    for e in events:
        if e.get("exc_info") or e.get("event") in ("primitive_failed", "tool_failed"):
            faults.append(f"logged {e.get('event')}: {str(e)[:300]}")
    return not problems, problems, faults


def _accepted_faults(raw: Any, *, run: bool, tests: bool) -> list[str]:
    faults: list[str] = []
    try:
        spec = as_spec(raw)
        # The stored form, read back by a service, is the same valid spec.
        again = EnvironmentSpec.model_validate_json(spec.canonical_json())
        if again.spec_hash() != spec.spec_hash():
            faults.append("accepted, but its stored form reads back as another spec")
        if (later := validate_environment(again)) != []:
            faults.append(f"accepted, but its stored form is refused: {later[:3]}")
    except Exception as exc:  # noqa: BLE001 - the fuzzer's finding
        return [f"accepted, but not storable: {type(exc).__name__}: {exc}"[:400]]
    if not run:
        return faults
    loop = asyncio.new_event_loop()
    try:
        for index in range(min(2, len(spec.tasks))):
            loop.run_until_complete(_episode(spec, index, faults, tests))
    except Exception as exc:  # noqa: BLE001 - the fuzzer's finding
        faults.append(f"accepted, but an episode crashed: {type(exc).__name__}: {exc}"[:400])
    finally:
        loop.close()
    return faults


# ------------------------------------------------------------------ through `rollout plan FILE`

# The keyword arguments of Environment(...): a mutant with other keys is no env file's.
ENV_ARGUMENTS = {
    "slug",
    "name",
    "template",
    "description",
    "config",
    "tasks",
    "verifier",
    "budgets",
}


def env_file(folder: Path, name: str, raw: dict[str, Any]) -> Path | None:
    """An env file building the mutant with Environment(...), as a user would write it (None
    for one nested too deep for json to write)."""
    try:
        text = json.dumps(raw)  # NaN and lone surrogates survive json.loads
    except RecursionError:
        return None
    body = (
        "import json\n"
        "from rollout import Environment\n"
        f"SPEC = json.loads({text!r})\n"
        "env = Environment(**SPEC)\n"
    )
    file = folder / f"{name}.py"
    file.write_text(body, encoding="utf-8")
    return file


def plan_faults(doc: dict[str, Any], file: Path, raw: dict[str, Any]) -> list[str]:
    """What is wrong with a `rollout plan --json` document about a mutant."""
    if "error" in doc:  # the file did not load: said with its file and line
        if not doc["error"].startswith(f"{file}:"):
            return [f"load error names no file and line: {doc['error'][:300]}"]
        return []
    faults = []
    for env in doc["environments"]:
        faults += problem_faults(env["problems"], raw)
    # What Environment(...) makes of the mutant (its defaults fill a dropped name, template or
    # config; a plugin's sources are bundled) must be what plan judged.
    if doc["ok"] and (refused := validate_environment(Environment(**raw))):
        faults.append(f"plan accepted an env whose validation refuses: {refused[:3]}")
    return faults
