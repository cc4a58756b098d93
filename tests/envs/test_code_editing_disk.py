"""Code that fills the disk fails its test run, which says so: the model's failure, not infra."""

from __future__ import annotations

import glob
import tempfile

import pytest

from rollout import code_editing_config
from rollout.shared.envs.templates.code_editing import (
    CodeEditingConfig,
    run_hidden_tests,
    run_tests_in_sandbox,
)
from rollout.shared.envs.validation import validate_environment

# Imported by the tests: writes 20 files of 50 MB (each under the per-file limit) where it runs.
FILLS = """
import os
chunk = b"x" * (1 << 20)
for i in range(20):
    with open(f"big{i}", "wb") as f:
        for _ in range(50):
            f.write(chunk)


def add(a, b):
    return a + b
"""
HONEST = "def add(a, b):\n    return a + b\n"
TESTS = {"test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"}


def _leftovers() -> list[str]:
    return glob.glob(f"{tempfile.gettempdir()}/rollout-code-*/big*")


@pytest.mark.parametrize("isolate", [True, False])
async def test_hidden_tests_of_code_that_fills_the_disk_fail_saying_so(isolate: bool) -> None:
    before = set(_leftovers())
    run = await run_hidden_tests({"calc.py": FILLS}, TESTS, disk_mb=64, isolate=isolate)
    assert not run.passed
    assert run.reason == "the test run was stopped (disk_limit)"
    assert set(_leftovers()) == before  # the run's folders are gone


async def test_hidden_tests_of_honest_code_pass_under_the_budget() -> None:
    run = await run_hidden_tests({"calc.py": HONEST}, TESTS, disk_mb=64)
    assert run.passed, run.reason


async def test_the_run_tests_tool_says_the_disk_limit_stopped_it() -> None:
    files = {"calc.py": FILLS, **TESTS}
    result = await run_tests_in_sandbox(files, ["python3", "-c", "import calc"], disk_mb=64)
    assert result["passed"] is False
    assert result["killedReason"] == "disk_limit"


def test_the_config_sets_the_budget_and_a_bad_one_is_named() -> None:
    assert CodeEditingConfig().disk_mb == 512
    config = code_editing_config({"calc.py": HONEST}, disk_mb=100)
    assert CodeEditingConfig.model_validate(config).disk_mb == 100
    raw = {
        "slug": "calc",
        "template": "code-editing",
        "config": {**config, "diskMb": 0},
        "tasks": [{"instruction": "fix", "hiddenGroundTruth": {"tests": TESTS}}],
    }
    assert validate_environment(raw) == [
        "config.diskMb: Input should be greater than or equal to 1"
    ]
