"""The code-editing template: file tools, and tests run in the real bubblewrap sandbox."""

from __future__ import annotations

import pytest

from rollout import Environment, RolloutError, Task, code_editing_config
from rollout.shared.envs import build_runtime, run_tool_script, score, validate_environment

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
VISIBLE = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
HIDDEN = "from calc import add\n\n\ndef test_more():\n    assert add(-1, 1) == 0\n"


def env(ground_truth: dict | None = None, **config: object) -> Environment:
    return Environment(
        slug="calc",
        template="code-editing",
        config=code_editing_config(
            {"calc.py": BUGGY, "tests/test_calc.py": VISIBLE},
            test_command=config.get("test_command", "python3 -m pytest -q -p no:cacheprovider"),
        ),
        tasks=[
            Task(
                instruction="fix add",
                hidden_ground_truth=ground_truth
                if ground_truth is not None
                else {"tests": {"test_hidden.py": HIDDEN}},
            )
        ],
    )


async def test_file_tools() -> None:
    rt = build_runtime(env(), 0)
    names = [t.name for t in rt.tool_specs()]
    assert names == ["list_files", "read_file", "write_file", "delete_file", "run_tests"]
    assert (await rt.call_tool("list_files", {})).output == ["calc.py", "tests/test_calc.py"]
    assert (await rt.call_tool("read_file", {"path": "calc.py"})).output["content"] == BUGGY
    assert (await rt.call_tool("read_file", {"path": "./calc.py"})).ok  # normalised
    w = await rt.call_tool("write_file", {"path": "pkg/new.py", "content": "x = 1\n"})
    assert w.output == {"path": "pkg/new.py", "created": True, "bytes": 6}
    for bad in ("../escape.py", "/etc/passwd", "a/../../b", "", "x\x00y"):
        r = await rt.call_tool("write_file", {"path": bad, "content": "boom"})
        assert r.error, bad
    assert (await rt.call_tool("delete_file", {"path": "pkg/new.py"})).ok
    assert "no file" in (await rt.call_tool("delete_file", {"path": "pkg/new.py"})).error
    assert rt.final_state() == {
        "files": {"calc.py": BUGGY, "tests/test_calc.py": VISIBLE},
        "testRuns": 0,
    }


async def test_run_tests_tool_in_sandbox() -> None:
    rt = build_runtime(env(), 0)
    failing = (await rt.call_tool("run_tests", {})).output
    assert failing["passed"] is False and failing["exitCode"] != 0
    assert "assert" in failing["stdout"]
    await rt.call_tool("write_file", {"path": "calc.py", "content": FIXED})
    passing = (await rt.call_tool("run_tests", {})).output
    assert passing["passed"] is True, passing
    assert rt.final_state()["testRuns"] == 2


async def test_tests_pass_uses_hidden_tests() -> None:
    e = env()
    fixed = await run_tool_script(e, 0, [("write_file", {"path": "calc.py", "content": FIXED})])
    result = await score(e, 0, fixed)
    assert result.passed and result.primitives[0].type == "tests_pass", result
    # A fix that passes the visible test but not the hidden one fails the verifier.
    cheat = "def add(a, b):\n    return 5\n"
    cheated = await run_tool_script(e, 0, [("write_file", {"path": "calc.py", "content": cheat})])
    result = await score(e, 0, cheated)
    reason = result.primitives[0].reason
    assert not result.passed and reason.startswith("hidden test test_hidden.py::test_more failed")
    assert "assert 5 == 0" in reason


async def test_sandbox_blocks_writes_outside_and_network() -> None:
    probe = (
        "import socket, pathlib\n\n\ndef test_probe():\n"
        "    try:\n        pathlib.Path('/etc/rollout-pwned').write_text('x')\n"
        "        wrote = True\n    except OSError:\n        wrote = False\n"
        "    try:\n        socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "        net = True\n    except OSError:\n        net = False\n"
        "    assert not wrote and not net\n"
    )
    e = env({"tests": {"test_probe.py": probe}})
    t = await run_tool_script(e, 0, [("write_file", {"path": "calc.py", "content": FIXED})])
    result = await score(e, 0, t)
    assert result.passed, result.primitives[0].reason


async def test_files_ground_truth_default_verifier() -> None:
    e = env({"files": {"calc.py": FIXED}})
    good = await run_tool_script(e, 0, [("write_file", {"path": "calc.py", "content": FIXED})])
    assert (await score(e, 0, good)).passed
    bad = await run_tool_script(e, 0, [])
    result = await score(e, 0, bad)
    assert not result.passed and "files" in result.primitives[0].reason


async def test_missing_bwrap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_BWRAP", "/nonexistent/bwrap")
    e = env()
    rt = build_runtime(e, 0)
    r = await rt.call_tool("run_tests", {})
    assert r.error and "bwrap" in r.error.lower()
    t = await run_tool_script(e, 0, [])
    result = await score(e, 0, t)
    assert not result.passed and result.error and "bwrap" in result.error.lower()


def test_validation_of_paths_and_command() -> None:
    bad = Environment(
        slug="calc",
        template="code-editing",
        config={"files": {"../x.py": "", "ok.py": ""}, "testCommand": []},
        tasks=[Task(instruction="x", hidden_ground_truth={"tests": {"/abs.py": "x"}})],
    )
    problems = validate_environment(bad)
    assert "config.files[\"../x.py\"]: path '../x.py' escapes the project root" in problems
    assert "config.testCommand: empty command" in problems
    assert any(p.startswith('tasks[0].hiddenGroundTruth.tests["/abs.py"]') for p in problems)
    broken = Environment(
        slug="c", template="code-editing", config={"files": []}, tasks=[Task(instruction="x")]
    )
    with pytest.raises(RolloutError) as err:
        build_runtime(broken, 0)
    assert "config.files: Input should be a valid dictionary" in str(err.value)


def test_a_hidden_test_file_that_does_not_parse_is_refused_before_any_run() -> None:
    # Every rollout would fail tests_pass on it, however right the fix: plan and push say so.
    e = hidden_env(
        {"test_h.py": "def test_x(:\n    pass\n", "test_ok.py": "def test_y():\n    pass\n"}
    )
    assert validate_environment(e) == [
        'tasks[0].hiddenGroundTruth.tests["test_h.py"]: does not parse: invalid syntax (line 1)'
    ]
    assert "does not parse: source code string cannot contain null bytes" in " ".join(
        validate_environment(hidden_env({"test_h.py": "def test_x():\n    pass\x00\n"}))
    )
    # A command that is not pytest runs what it likes: its files are not read as tests.
    assert validate_environment(hidden_env({"test_h.py": "def (:"}, ["bash", "check.sh"])) == []


def hidden_env(tests: dict[str, str], command: object = None) -> Environment:
    config = code_editing_config({"calc.py": BUGGY}, test_command=command)
    return Environment(
        slug="calc",
        template="code-editing",
        config=config,
        tasks=[Task(instruction="fix add", hidden_ground_truth={"tests": tests})],
    )


async def hidden_verdict(e: Environment, content: str = FIXED) -> tuple[bool, str]:
    t = await run_tool_script(e, 0, [("write_file", {"path": "calc.py", "content": content})])
    result = await score(e, 0, t)
    assert result.error is None, result
    return result.passed, result.primitives[0].reason


async def test_non_pytest_command_keeps_exit_code_semantics() -> None:
    check = "from calc import add\nassert add(2, 3) == 5\n"
    e = hidden_env({"check.py": check}, command=["python3", "check.py"])
    ok, reason = await hidden_verdict(e)
    assert ok and "exit code of ['python3', 'check.py']" in reason, reason
    ok, reason = await hidden_verdict(e, BUGGY)
    assert not ok and reason.startswith("tests failed (exit code 1)"), reason


async def test_hidden_test_problems_are_named() -> None:
    ok, reason = await hidden_verdict(hidden_env({"test_h.py": "def test_x(:\n"}))
    assert not ok and reason.startswith("hidden test file test_h.py does not parse"), reason
    ok, reason = await hidden_verdict(hidden_env({"test_h.py": "X = 1\n"}))
    assert not ok and reason == "the hidden test files define no test functions"


async def test_a_skipped_or_xfailed_hidden_test_is_not_a_pass() -> None:
    skipped = "import pytest\n\n\n@pytest.mark.skip\ndef test_x():\n    pass\n"
    ok, reason = await hidden_verdict(hidden_env({"test_h.py": skipped}))
    assert not ok and reason.startswith("hidden test test_h.py::test_x skipped"), reason
    xfail = "import pytest\n\n\n@pytest.mark.xfail\ndef test_x():\n    assert False\n"
    ok, reason = await hidden_verdict(hidden_env({"test_h.py": xfail}))
    assert not ok and reason.startswith("hidden test test_h.py::test_x skipped"), reason


async def test_hidden_conftest_classes_unittest_and_subdirs_are_honoured() -> None:
    tests = {
        "tests/conftest.py": "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n",
        "tests/test_fixture.py": "from calc import add\n\n\ndef test_two(two):\n"
        "    assert add(two, two) == 4\n",
        "tests/test_cls.py": "import unittest\n\nfrom calc import add\n\n\n"
        "class Adds(unittest.TestCase):\n    def test_one(self):\n"
        "        self.assertEqual(add(1, 0), 1)\n\n\n"
        "class TestNested:\n    class TestInner:\n        @staticmethod\n"
        "        def test_inner():\n            assert add(3, 4) == 7\n",
    }
    e = hidden_env(tests)
    ok, reason = await hidden_verdict(e)
    assert ok and reason.startswith("3 hidden test(s) passed"), reason
    # The author's conftest is loaded; the model's (next to its code) still has no say.
    skip_all = (
        "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
        "    for item in items:\n        item.add_marker(pytest.mark.skip('no'))\n"
    )
    steps = [
        ("write_file", {"path": "conftest.py", "content": skip_all}),
        ("write_file", {"path": "tests/conftest.py", "content": skip_all}),
    ]
    result = await score(e, 0, await run_tool_script(e, 0, steps))
    reason = result.primitives[0].reason
    assert not result.passed
    assert reason.startswith(
        "hidden test tests/test_cls.py::TestNested::TestInner::test_inner failed"
    )


def test_hidden_ids_come_from_the_ast() -> None:
    from rollout.shared.envs.templates.code_editing import collect_hidden_tests

    source = (
        "def test_a(): pass\ndef helper(): pass\nasync def test_b(): pass\n"
        "class TestC:\n    def test_d(self): pass\n    def other(self): pass\n"
        "class TestWithInit:\n    def __init__(self): pass\n    def test_e(self): pass\n"
    )
    found = collect_hidden_tests("pkg/test_m.py", source)
    assert [t.fid for t in found] == [
        "pkg/test_m.py::test_a",
        "pkg/test_m.py::test_b",
        "pkg/test_m.py::TestC::test_d",
    ]
    assert found[2].junit == ("pkg.test_m.TestC", "test_d")
