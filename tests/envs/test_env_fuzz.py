"""Mutated example envs (env_mutants): accepted and runnable, or refused by field path.

A seeded sample of a few hundred mutants goes to `validate_environment` (what `rollout plan`
and `rollout push` run) and, when accepted, through an episode and the verifier; a smaller
sample goes through `rollout plan FILE --json` on a written env file, in-process and as the
console script. benchmarks/env_fuzz.py runs thousands the same way.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envs.env_mutants import (
    ENV_ARGUMENTS,
    env_file,
    examples,
    judge,
    mutants,
    plan_faults,
    problem_faults,
)
from rollout.cli import main
from rollout.shared.envs import validate_environment

ROOT = Path(__file__).resolve().parents[2]


def _example(slug: str) -> dict[str, Any]:
    return copy.deepcopy(next(r for r in examples() if r["slug"] == slug))


def test_seeded_mutants_are_accepted_and_run_or_refused_by_path() -> None:
    counts = {"accepted": 0, "refused": 0}
    found = []
    for label, raw in mutants(seed=7, n=400):
        ok, _, faults = judge(raw)
        counts["accepted" if ok else "refused"] += 1
        found += [f"{label}: {f}" for f in faults]
    assert not found, found[:5]
    # Both answers are exercised: a fuzzer whose mutants are all refused checks no episode.
    assert counts["accepted"] > 40 and counts["refused"] > 200, counts


@pytest.mark.parametrize("depth", [100, 300, 1500])
def test_a_spec_nested_too_deep_is_refused_where_it_is(depth: int) -> None:
    # 300 levels passed plan and push, then no service could store it (pydantic stops writing
    # JSON near 255); 1,500 made each recursive check say "could not be checked".
    node: Any = 1
    for _ in range(depth):
        node = {"k": node}
    raw = _example("refund-agent")
    raw["tasks"][0]["hiddenGroundTruth"] = {"refunds": node}
    problems = validate_environment(raw)
    assert len(problems) == 1, problems
    path = "tasks[0].hiddenGroundTruth.refunds" + ".k" * 60
    assert problems[0] == (
        f"{path}: nested deeper than 64 levels of lists and objects (a spec is JSON that "
        "services store and read back: flatten it)"
    )
    assert not problem_faults(problems, raw)


def test_a_spec_without_config_is_checked_as_the_empty_config_it_is_stored_with() -> None:
    # It passed, was stored with `config: {}`, and no episode could start ("invalid config").
    sql = _example("sales-sql")
    del sql["config"]
    assert validate_environment(sql) == ["config.schema: Field required"]
    workflow = _example("refund-agent")
    del workflow["config"]
    assert validate_environment(workflow) == [
        "tasks[0].hiddenGroundTruth.refunds: not in the environment's state (state keys: none)"
    ]


def test_a_key_that_reads_as_a_path_is_quoted_in_the_problem() -> None:
    raw = _example("refund-agent")
    raw["tasks"][0].update({"a.b": 1, "": 2, "[0]": 3, "\x00": 4})
    raw["ключ"] = 5
    assert validate_environment(raw) == [
        'tasks[0]["a.b"]: unknown key (check the spelling)',
        'tasks[0][""]: unknown key (check the spelling)',
        'tasks[0]["[0]"]: unknown key (check the spelling)',
        'tasks[0]["\\u0000"]: unknown key (check the spelling)',
        "ключ: unknown key (check the spelling)",
        "tasks[0]: key '\\x00' contains a NUL character",
    ]


def test_a_union_param_is_one_line_at_its_field() -> None:
    raw = _example("fix-calc")
    raw["verifier"] = {"primitives": [{"name": "t", "type": "tests_pass", "command": 3}]}
    assert validate_environment(raw) == [
        "verifier.primitives[0].command: Input should be a valid list (list[str]); "
        "or Input should be a valid string (str)"
    ]


@pytest.mark.parametrize(
    ("slug", "truth", "problem"),
    [
        # form_submitted read the form's id from the ground truth: a list crashed every score.
        (
            "shop-signup",
            {"form": ["signup"], "fields": {}},
            "tasks[0].hiddenGroundTruth.form: Input should be a valid string",
        ),
        (
            "shop-signup",
            {"form": "signup", "fields": "plan=free"},
            "tasks[0].hiddenGroundTruth.fields: Input should be a valid dictionary",
        ),
        # sql_result_match: rows that are no list; tests_pass: a command that is a number.
        (
            "sales-sql",
            {"rows": "42"},
            "tasks[0].hiddenGroundTruth.rows: Input should be a valid list",
        ),
        (
            "fix-calc",
            {"tests": {"test_t.py": "def test_t():\n    pass\n"}, "testCommand": 3},
            "tasks[0].hiddenGroundTruth.testCommand: Input should be a valid list (list[str]); "
            "or Input should be a valid string (str)",
        ),
    ],
)
def test_a_ground_truth_a_primitive_reads_is_checked_as_its_param(
    slug: str, truth: dict[str, Any], problem: str
) -> None:
    raw = _example(slug)
    raw["tasks"][0]["hiddenGroundTruth"] = truth
    assert validate_environment(raw) == [problem]


def test_ground_truth_keys_the_verifier_reads_are_not_called_unread() -> None:
    # sql_result_match reads `orderMatters` and tests_pass `testCommand` from the ground
    # truth: plan refused both as "not read by the default verifier".
    sql = _example("sales-sql")
    sql.pop("verifier", None)
    sql["tasks"][0]["hiddenGroundTruth"] = {"rows": [[1]], "orderMatters": True}
    assert validate_environment(sql) == []
    code = _example("fix-calc")
    code.pop("verifier", None)
    code["tasks"] = code["tasks"][:1]
    code["tasks"][0]["hiddenGroundTruth"] = {
        "tests": {"test_t.py": "def test_t():\n    pass\n"},
        "testCommand": ["python", "-m", "pytest", "-q"],
    }
    assert validate_environment(code) == []


# ------------------------------------------------------------------ through the CLI


def test_plan_on_written_mutant_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found, loaded = [], 0
    for i, (label, raw) in enumerate(mutants(seed=11, n=40)):
        if not isinstance(raw, dict) or set(raw) - ENV_ARGUMENTS:
            continue  # not Environment(...) arguments: the loader's TypeError names the line
        file = env_file(tmp_path, f"m{i}", raw)
        if file is None:
            continue
        code = main(["plan", str(file), "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert code == (0 if doc["ok"] else 1), label
        loaded += "error" not in doc
        found += [f"{label}: {f}" for f in plan_faults(doc, file, raw)]
    assert not found, found[:5]
    assert loaded > 20


def test_plan_console_script_on_mutant_files_prints_no_traceback(tmp_path: Path) -> None:
    sample = [m for m in mutants(seed=5, n=12) if set(m[1]) <= ENV_ARGUMENTS][:2]
    script = Path(sys.executable).parent / "rollout"
    for i, (label, raw) in enumerate(sample):
        file = env_file(tmp_path, f"c{i}", raw)
        assert file is not None
        proc = subprocess.run(
            [str(script), "plan", str(file), "--json"],
            capture_output=True, text=True, cwd=tmp_path, timeout=120,
        )  # fmt: skip
        assert proc.returncode in (0, 1), (label, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, (label, proc.stderr[-2000:])
        doc = json.loads(proc.stdout)
        assert not plan_faults(doc, file, raw), (label, doc)


def test_a_plugin_source_json_cannot_carry_is_a_problem_not_a_crash() -> None:
    # validate_environment raised UnicodeEncodeError: the source went to a plugin host as is.
    raw = _example("counter-plugin")
    raw["config"]["sources"]["example_plugins/counter.py"] = "x = 1  # \ud800\n"
    assert validate_environment(raw) == [
        "config.sources[\"example_plugins/counter.py\"]: contains '\\ud800' at position 9, "
        "which is not UTF-8 text"
    ]


def test_a_params_schema_key_that_reads_as_a_path_is_quoted() -> None:
    raw = _example("refund-agent")
    raw["config"]["tools"][0]["paramsSchema"] = {
        "order_id": "string",
        "[0]": 1,
        "a.b": {"type": "nope"},
    }
    assert validate_environment(raw) == [
        'config.tools[0].paramsSchema["[0]"]: unknown type 1 (use one of: string, number, '
        "integer, boolean, array, object, any)",
        "config.tools[0].paramsSchema[\"a.b\"]: unknown type 'nope' (use one of: string, number, "
        "integer, boolean, array, object, any)",
    ]
