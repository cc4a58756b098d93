"""The `code-editing` template: files in memory; tests run in the bubblewrap sandbox.

Tools: `list_files`, `read_file`, `write_file`, `delete_file`, and `run_tests` when the config has
a `testCommand`. The project is the config's `files` plus the task's own `input.files` (a task's
files win), so every task can bring its own code. The final state is
`{"files": {path: content}, "testRuns": n}`. Hidden tests from the task's ground truth (`tests`:
path -> content) are only run by the `tests_pass` verifier primitive (`run_hidden_tests`), never
shown to the agent nor placed in its work dir.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import fnmatch
import json
import os
import posixpath
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import Field

from rollout.shared.contracts.envspec import CamelModel, EnvironmentSpec, TaskSpec
from rollout.shared.envs.sandbox import SandboxLimits, run_sandboxed, run_sandboxed_with_peer
from rollout.shared.envs.templates.base import BaseRuntime, ToolError
from rollout.shared.envs.templates.protocol import STATE_MATCH, Template

log = structlog.get_logger(__name__)

# The config of its specs: a contract (schemas/templates/<name>.json is generated from it).


class CodeEditingConfig(CamelModel):
    """Config of the `code-editing` template: files, and how to run the tests in the sandbox."""

    files: dict[str, str] = Field(default_factory=dict)
    test_command: list[str] | str | None = None
    test_timeout_seconds: float = Field(default=60.0, gt=0, le=600)
    memory_mb: int = Field(default=512, ge=64, le=16_384)
    disk_mb: int = Field(
        default=512,
        ge=1,
        le=65_536,
        description=(
            "What a test run may write to its folders (the project, pytest's tmp_path) in MiB; "
            "past it the run is stopped (`disk_limit`) and fails."
        ),
    )
    test_isolation: Literal["process", "in-process"] = Field(
        default="process",
        description=(
            "How `tests_pass` runs the hidden tests: `process` (the model's code in a sandbox "
            "of its own, reached through proxies, so it cannot touch the tests' process or "
            "report) or `in-process` (imported into the tests' process: forgeable by code "
            "written against the harness; for tests the proxies cannot express)."
        ),
    )


DEFAULT_TEST_COMMAND = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
MAX_FILE_BYTES = 1_000_000
MAX_FILES = 2_000
OUTPUT_TAIL = 4_000


def check_file_path(path: Any) -> str:
    """A safe relative POSIX path, or ToolError saying why not."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string")
    if "\x00" in path:
        raise ToolError("path must not contain null bytes")
    if len(path) > 255:
        raise ToolError("path must be at most 255 characters")
    if path.startswith("/") or path.startswith("\\"):
        raise ToolError(f"path {path!r} must be relative to the project root")
    norm = posixpath.normpath(path)
    if norm == "." or norm.startswith("../") or norm == ".." or "/../" in f"/{norm}/":
        raise ToolError(f"path {path!r} escapes the project root")
    return norm


def test_command(value: list[str] | str | None) -> list[str]:
    """The test command as argv; `python3` means this interpreter (the venv's, with pytest)."""
    if value is None:
        argv = list(DEFAULT_TEST_COMMAND)
    elif isinstance(value, str):
        argv = shlex.split(value)
    else:
        argv = list(value)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def task_files(task: TaskSpec) -> dict[str, str]:
    """The task's own files (`input.files`: path -> content), added to the config's."""
    files = (task.input or {}).get("files") or {}
    return dict(files) if isinstance(files, dict) else {}


def _tail(text: str) -> str:
    return text if len(text) <= OUTPUT_TAIL else "..." + text[-OUTPUT_TAIL:]


def _limits(timeout_s: float, memory_mb: int, disk_mb: int) -> SandboxLimits:
    return SandboxLimits(
        cpu_seconds=max(1, int(timeout_s)),
        memory_mb=memory_mb,
        wall_seconds=timeout_s,
        max_disk_bytes=disk_mb * 1024 * 1024,
    )


async def run_tests_in_sandbox(
    files: dict[str, str],
    command: list[str] | str | None,
    *,
    timeout_s: float = 60.0,
    memory_mb: int = 512,
    disk_mb: int = 512,
) -> dict[str, Any]:
    """Materialise files in a temp dir, run the command in the sandbox, report the outcome.

    Raises SandboxUnavailable (a RolloutError) when bubblewrap cannot be used: tests never run
    unsandboxed.
    """
    argv = test_command(command)
    if not argv:
        raise ToolError("the test command is empty")
    limits = _limits(timeout_s, memory_mb, disk_mb)
    with tempfile.TemporaryDirectory(prefix="rollout-code-") as tmp:
        root = Path(tmp)
        for rel, content in files.items():
            target = root / check_file_path(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        result = await run_sandboxed(argv, root, limits)
    passed = result.exit_code == 0 and not result.timed_out and not result.killed_reason
    return {
        "passed": passed,
        "exitCode": result.exit_code,
        "timedOut": result.timed_out,
        "killedReason": result.killed_reason,
        "stdout": _tail(result.stdout),
        "stderr": _tail(result.stderr),
        "durationS": round(result.duration_s, 3),
    }


# ---------------------------------------------------------------- hidden tests (tests_pass)

TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "conftest.py")
MAX_REPORT_BYTES = 20_000_000
PROBE_SOURCE = Path(__file__).with_name("_pytest_probe.py")
WIRE_SOURCE = Path(__file__).with_name("_xproc_wire.py")
TESTS_SIDE_SOURCE = Path(__file__).with_name("_xproc_tests.py")
CONFINE_SOURCE = Path(__file__).with_name("_xproc_confine.py")
SUBJECT_SOURCE = Path(__file__).with_name("_xproc_subject.py")

# Runs as `python -I -c`: no cwd, PYTHONPATH or user site on sys.path, so no file of the model's
# can stand in for pytest or the probe; the probe is registered before pytest is imported.
_BOOTSTRAP = r"""
import importlib.util, sys
harness = sys.argv[1]
spec = importlib.util.spec_from_file_location("_rollout_probe", harness + "/_rollout_probe.py")
probe = importlib.util.module_from_spec(spec)
sys.modules["_rollout_probe"] = probe
spec.loader.exec_module(probe)
import pytest
raise SystemExit(int(pytest.main(sys.argv[2:], plugins=[probe])))
"""


# The isolated form: the tests' process also installs the finder that turns the model's modules
# into proxies of a second sandbox (before pytest runs, after it is imported so that nothing
# pytest needs can be taken for the model's), and becomes undumpable so no process it starts (a
# test may run the model's script) can trace it or open its files through /proc.
_ISOLATED_BOOTSTRAP = r"""
import ctypes, importlib.util, sys
harness = sys.argv[1]
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
def load(name):
    spec = importlib.util.spec_from_file_location(name, harness + "/" + name + ".py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
probe = load("_rollout_probe")
import pytest
load("_xproc_wire")
load("_xproc_confine")
load("_xproc_tests").install(harness + "/remote.json")
raise SystemExit(int(pytest.main(sys.argv[2:], plugins=[probe])))
"""

# The model's side: its own sandbox, the work dir as cwd, serving the tests over stdin/stdout.
_SUBJECT_BOOTSTRAP = r"""
import importlib.util, sys
harness = sys.argv[1]
for name in ("_xproc_wire", "_xproc_subject"):
    spec = importlib.util.spec_from_file_location(name, harness + "/" + name + ".py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
sys.modules["_xproc_subject"].serve()
"""


def model_module_names(files: dict[str, str], trusted: dict[str, str]) -> list[str]:
    """Top-level module names the model's files define (the trusted tests' own names aside)."""

    def top(path: str) -> str | None:
        first, _, rest = path.partition("/")
        if not rest:
            return first[:-3] if first.endswith(".py") else None
        return first if path.endswith(".py") else None

    # pytest puts each test file's directory on sys.path, so any directory or module of the
    # trusted tree that holds code can be imported by its bare name (`tests/lib/checks.py` as
    # `lib.checks`, `tests/helpers/__init__.py` as `helpers`): none of them may become a proxy.
    mine: set[str | None] = set()
    for path in trusted:
        if path.endswith(".py"):
            *dirs, name = path.split("/")
            mine.update(dirs)
            mine.add(name[:-3])
    names = {top(p) for p in files} - mine
    return sorted(n for n in names if n and n.isidentifier())


def is_pytest_command(argv: list[str]) -> bool:
    """True when the test command runs pytest (`pytest ...` or `python -m pytest ...`)."""
    if not argv:
        return False
    if posixpath.basename(argv[0]) in ("pytest", "py.test"):
        return True
    return any(a == "-m" and b == "pytest" for a, b in zip(argv, argv[1:], strict=False))


def trusted_test_files(config_files: dict[str, str], hidden: dict[str, str]) -> dict[str, str]:
    """The tests the verifier trusts: the config's own test files as the author wrote them, then
    the hidden ones (which win on the same path). The model's versions play no part."""
    out = {
        path: content
        for path, content in config_files.items()
        if any(fnmatch.fnmatch(posixpath.basename(path), pat) for pat in TEST_FILE_PATTERNS)
    }
    out.update(hidden)
    return out


@dataclass
class HiddenTest:
    """One test function found in a hidden file by parsing it (never by importing it)."""

    fid: str  # path::[Class::]name, as pytest's node id without parameters
    path: list[str]  # attribute path inside the module
    junit: tuple[str, str]  # (classname, name) as pytest's JUnit report spells it


def _is_test_class(node: ast.ClassDef) -> bool:
    if node.name.startswith("Test"):
        return not any(isinstance(n, ast.FunctionDef) and n.name == "__init__" for n in node.body)
    names = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
    return any(n.endswith("TestCase") for n in names)


def collect_hidden_tests(path: str, source: str) -> list[HiddenTest]:
    """The test functions and methods of one file, from its AST (SyntaxError if it has none)."""
    tree = ast.parse(source, filename=path)
    module = path[:-3].replace("/", ".") if path.endswith(".py") else path.replace("/", ".")
    found: list[HiddenTest] = []

    def visit(body: list[ast.stmt], prefix: list[str]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name.startswith("test"):
                    parts = [*prefix, node.name]
                    found.append(
                        HiddenTest(
                            fid="::".join([path, *parts]),
                            path=parts,
                            junit=(".".join([module, *prefix]), node.name),
                        )
                    )
            elif isinstance(node, ast.ClassDef) and _is_test_class(node):
                visit(node.body, [*prefix, node.name])

    visit(tree.body, [])
    return found


def instrument(source: str, tests: list[HiddenTest]) -> str:
    """The source with lines appended that wrap each test to record its completion.

    Appended, so line numbers in failures stay the author's; the `assert False` is compiled with
    the module, so a module compiled without asserts is caught.
    """
    lines = [
        "",
        "# rollout: record that each hidden test's body ran to its end (added by the verifier).",
        "import _rollout_probe as __rollout_probe__",
    ]
    lines += [f"__rollout_probe__.wrap(globals(), {t.path!r}, {t.fid!r})" for t in tests]
    lines += [
        "try:",
        "    assert False",
        "except AssertionError:",
        "    pass",
        "else:",
        "    __rollout_probe__.asserts_compiled_out(__name__)",
        "",
    ]
    return source + ("" if source.endswith("\n") else "\n") + "\n".join(lines)


@dataclass
class HiddenRun:
    """The verdict of one hidden test run and the evidence behind it."""

    passed: bool
    reason: str
    passed_ids: list[str] = field(default_factory=list)
    exit_code: int | None = None
    duration_s: float = 0.0
    output_tail: str = ""


def _write_tree(root: Path, files: dict[str, str], mode: int = 0o644) -> None:
    for rel, content in files.items():
        target = root / check_file_path(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        target.chmod(mode)
    for dirpath, _, _ in os.walk(root):
        os.chmod(dirpath, 0o755)


def _real(path: Path) -> str:
    """The path with every symlink resolved, as the sandbox binds it."""
    return os.path.realpath(path)


def _ini(workdir: Path | None, nonce: str) -> str:
    # Pinned: nothing here comes from the model's files (its pytest.ini, pyproject.toml,
    # setup.cfg, tox.ini are never read because -c names this file). Isolated runs put no
    # model file on sys.path at all (workdir None): its modules come through the finder.
    return (
        "[pytest]\n" + (f"pythonpath = {workdir}\n" if workdir is not None else "") + "addopts =\n"
        "python_files = test_*.py *_test.py\n"
        "python_classes = Test\n"
        "python_functions = test\n"
        "xfail_strict = true\n"
        "junit_family = xunit2\n"
        f"junit_suite_name = {nonce}\n"
        "junit_logging = no\n"
        "console_output_style = classic\n"
    )


@dataclass
class Markers:
    """What the probe recorded: completions per test id, tampering seen, and the hidden tests
    its `wrap` was never asked to wrap (a `wrap` replaced, or a module that never imported)."""

    done: dict[str, int]
    tampered: list[str]
    unwrapped: list[str]


def _read_markers(path: Path, nonce: str) -> Markers:
    """The probe's records, read from its marker file."""
    done: dict[str, int] = {}
    tampered: list[str] = []
    unwrapped: list[str] = []
    if not path.is_file():
        return Markers(done, ["the probe's marker file is missing"], unwrapped)
    with path.open(encoding="utf-8", errors="replace") as f:
        text = f.read(MAX_REPORT_BYTES)
    for line in text.splitlines():
        parts = line.split("\t", 2)
        if len(parts) != 3 or parts[0] != nonce:
            tampered.append("the marker file holds a line the probe did not write")
            continue
        if parts[1] == "done":
            done[parts[2]] = done.get(parts[2], 0) + 1
        elif parts[1] == "tampered":
            tampered.append(parts[2])
        elif parts[1] == "unwrapped":
            unwrapped.append(parts[2])
    return Markers(done, tampered, unwrapped)


def _testcases(report: Path, nonce: str) -> list[tuple[str, str, str, str]] | str:
    """(classname, name, outcome, message) of each test in the report, or why it is unusable."""
    if not report.is_file():
        return "missing"
    if report.stat().st_size > MAX_REPORT_BYTES:
        return f"over {MAX_REPORT_BYTES} bytes"
    try:
        root = ET.parse(report).getroot()
    except ET.ParseError as exc:
        return f"not valid XML ({exc})"
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    suites = [s for s in suites if s.get("name") == nonce]
    if len(suites) != 1:
        return "not written by this run (its test suite name is wrong)"
    cases = []
    for case in suites[0].iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errored", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or (child.text or "")).strip()
                if message == "collection failure":
                    # pytest's generic line: the error itself is the text's first "E" line.
                    found = [
                        line[1:].strip()
                        for line in (child.text or "").splitlines()
                        if line.startswith("E ")
                    ]
                    message = found[0] if found else message
                break
        cases.append((case.get("classname") or "", case.get("name") or "", outcome, message))
    return cases


def _judge(
    expected: list[HiddenTest], cases: list[tuple[str, str, str, str]], markers: Markers
) -> tuple[bool, str, list[str]]:
    """Every expected test reported, each exactly once per parameter set, all passed, each
    body completed and wrapped by the harness, nothing tampered; anything else reported must
    pass too."""
    done, tampered = markers.done, markers.tampered
    if tampered:
        return False, "the code under test tampered with the test run: " + tampered[0], []
    if not cases:
        return False, "no hidden test was collected", []
    by_key = {t.junit: t for t in expected}
    seen: dict[tuple[str, str, str], int] = {}
    counts: dict[str, int] = {}
    failed: set[str] = set()
    problems: list[str] = []
    for classname, name, outcome, message in cases:
        key = (classname, name.split("[", 1)[0])
        test = by_key.get(key)
        if test is not None:
            label = "hidden test " + test.fid + name[len(key[1]) :]
        elif (classname, name) == ("pytest", "internal"):
            label = "pytest"  # an INTERNALERROR: the session itself broke
        elif not classname:
            label = f"collecting hidden file {name}"  # a module that failed to import
        else:
            label = f"hidden test {classname}::{name}"
        seen[(classname, name, "")] = seen.get((classname, name, ""), 0) + 1
        if seen[(classname, name, "")] == 2:
            problems.append(f"{label} was reported more than once")
        if outcome != "passed":
            why = f": {short_message(message)}" if message else ""
            problems.append(f"{label} {outcome}{why}")
        if test is not None:
            counts[test.fid] = counts.get(test.fid, 0) + 1
            if outcome != "passed":
                failed.add(test.fid)
    for test in expected:
        if test.fid not in counts:
            problems.append(f"hidden test {test.fid} did not run")
        elif test.fid not in failed and done.get(test.fid, 0) < counts[test.fid]:
            problems.append(
                f"hidden test {test.fid} was reported passed but its body never finished"
            )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return False, problems[0] + more, []
    if markers.unwrapped:
        # Every module imported and every test "ran", yet the harness wrapped none of them:
        # the completions on record were not its own.
        return (
            False,
            f"the code under test tampered with the test run: the harness never wrapped "
            f"{len(markers.unwrapped)} hidden test(s), e.g. {markers.unwrapped[0]}: its `wrap`"
            " was replaced",
            [],
        )
    return True, "", sorted(counts)


def short_message(text: str, limit: int = 200) -> str:
    """The first line of a failure message, capped."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


# bwrap reports a command that died of a signal as 128 + the signal.
_SIGKILLED = 128 + signal.SIGKILL


async def run_hidden_tests(
    files: dict[str, str],
    tests: dict[str, str],
    *,
    timeout_s: float = 60.0,
    memory_mb: int = 512,
    disk_mb: int = 512,
    isolate: bool = True,
) -> HiddenRun:
    """Run the trusted `tests` against the model's `files` (see `_run_hidden_once`).

    Isolated, the tests' process cannot be signalled by the model's code (another pid
    namespace), so a SIGKILL that none of the sandbox's limits sent came from the host (its
    out-of-memory killer, an operator): the verdict would say nothing about the code. Such a
    run is run once more from fresh directories, and the reason says so. In-process, the
    model's code could kill the tests itself, so its SIGKILL stays a failure.
    """
    run = await _run_hidden_once(
        files, tests, timeout_s=timeout_s, memory_mb=memory_mb, disk_mb=disk_mb, isolate=isolate
    )
    if not (isolate and run.exit_code == _SIGKILLED):
        return run
    log.warning("hidden_tests.killed_from_outside", duration_s=round(run.duration_s, 2))
    again = await _run_hidden_once(
        files, tests, timeout_s=timeout_s, memory_mb=memory_mb, disk_mb=disk_mb, isolate=isolate
    )
    again.reason += (
        f" (second run: the first one's test process was killed by a SIGKILL from outside the"
        f" sandbox after {run.duration_s:.1f}s)"
    )
    return again


async def _run_hidden_once(
    files: dict[str, str],
    tests: dict[str, str],
    *,
    timeout_s: float,
    memory_mb: int,
    disk_mb: int,
    isolate: bool,
) -> HiddenRun:
    """Run the trusted `tests` against the model's `files` with pytest, isolated from the files.

    The tests live in a private directory outside the work dir, bound read-only into the
    sandbox; pytest runs as `python -I` with a pinned config, rootdir and plugin set (no
    conftest, ini or plugin of the model's is read); the JUnit report and the probe's markers go
    to a private directory with random names and are read after the run. The exit code alone
    never passes. Raises SandboxUnavailable when bubblewrap cannot be used.

    With `isolate` (the default) the model's code never runs in the tests' process: it runs in
    a second sandbox that sees neither the tests, the harness nor the report, and the tests
    reach it through proxies (`_xproc_tests`), so nothing it does can write the evidence.
    Without, the tests import it (`in-process`: code written against the harness can forge).
    """
    expected: list[HiddenTest] = []
    runnable: dict[str, str] = {}
    for path, source in tests.items():
        check_file_path(path)
        if not path.endswith(".py"):
            runnable[path] = source
            continue
        try:
            found = collect_hidden_tests(path, source)
        except SyntaxError as exc:
            return HiddenRun(
                False, f"hidden test file {path} does not parse: {exc.msg} (line {exc.lineno})"
            )
        expected += found
        runnable[path] = instrument(source, found) if found else source
    if not expected:
        return HiddenRun(False, "the hidden test files define no test functions")
    nonce = secrets.token_hex(12)
    limits = _limits(timeout_s, memory_mb, disk_mb)
    private = Path(tempfile.mkdtemp(prefix="rollout-hidden-"))
    work = Path(tempfile.mkdtemp(prefix="rollout-code-"))
    try:
        tests_dir = private / f"tests-{secrets.token_hex(6)}"
        harness = private / f"harness-{secrets.token_hex(6)}"
        out = private / f"out-{secrets.token_hex(6)}"
        # tmp_path (isolated runs) lives where both sandboxes see it at the same path, so a
        # test can hand the model's code a path to write and read the file itself.
        scratch = private / f"scratch-{secrets.token_hex(6)}"
        for d in (tests_dir, harness, out):
            d.mkdir()
        for rel, content in files.items():
            target = work / check_file_path(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        _write_tree(tests_dir, runnable)
        report, markers = out / f"{nonce}.xml", out / f"{nonce}.markers"
        harness_files = {
            "pytest.ini": _ini(None if isolate else work, nonce),
            "_rollout_probe.py": PROBE_SOURCE.read_text(encoding="utf-8"),
            "probe.json": json.dumps(
                {"nonce": nonce, "markers": str(markers), "fids": [t.fid for t in expected]}
            ),
        }
        if isolate:
            harness_files["_xproc_wire.py"] = WIRE_SOURCE.read_text(encoding="utf-8")
            harness_files["_xproc_tests.py"] = TESTS_SIDE_SOURCE.read_text(encoding="utf-8")
            harness_files["_xproc_confine.py"] = CONFINE_SOURCE.read_text(encoding="utf-8")
            # The directories the model's process writes: the tests' process loads no file
            # from them (a test may put the work dir on sys.path or load a file by its path).
            harness_files["remote.json"] = json.dumps(
                {
                    "names": model_module_names(files, runnable),
                    "workdir": _real(work),
                    "scratch": _real(scratch),
                    # What a process the tests start must never reach.
                    "private": [_real(tests_dir), _real(harness), _real(out)],
                }
            )
        _write_tree(harness, harness_files)
        # The sandbox may run as a fresh uid: it must be able to write its report here.
        out.chmod(0o777)
        conftest = any(posixpath.basename(p) == "conftest.py" for p in runnable)
        test_paths = [
            str(tests_dir / p)
            for p in sorted(runnable)
            if p.endswith(".py") and posixpath.basename(p) not in ("conftest.py", "__init__.py")
        ]
        bootstrap = _ISOLATED_BOOTSTRAP if isolate else _BOOTSTRAP
        argv = [sys.executable, "-I", "-c", bootstrap, str(harness)]
        argv += ["-c", str(harness / "pytest.ini"), "--rootdir", str(tests_dir)]
        argv += ["--confcutdir", str(tests_dir), "-p", "no:cacheprovider", "-q"]
        argv += [] if conftest else ["--noconftest"]
        argv += ["--junitxml", str(report)]
        env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        binds = [(tests_dir, False), (harness, False), (out, True)]
        if isolate:
            scratch.mkdir(mode=0o1777)
            scratch.chmod(0o1777)
            subject = private / f"subject-{secrets.token_hex(6)}"
            subject.mkdir()
            _write_tree(
                subject,
                {
                    "_xproc_wire.py": WIRE_SOURCE.read_text(encoding="utf-8"),
                    "_xproc_subject.py": SUBJECT_SOURCE.read_text(encoding="utf-8"),
                },
            )
            argv += ["--basetemp", str(scratch / "pytest"), *test_paths]
            result = await run_sandboxed_with_peer(
                argv,
                [sys.executable, "-I", "-c", _SUBJECT_BOOTSTRAP, str(subject)],
                work,
                limits,
                env=env,
                binds=[*binds, (scratch, True)],
                peer_binds=[(subject, False), (scratch, True)],
            )
        else:
            argv += test_paths
            result = await run_sandboxed(argv, work, limits, env=env, binds=binds)
        tail = _tail((result.stdout + "\n" + result.stderr).strip())
        run = HiddenRun(
            False, "", exit_code=result.exit_code, duration_s=result.duration_s, output_tail=tail
        )
        if result.timed_out:
            run.reason = f"tests timed out after {timeout_s:g}s"
            return run
        if result.killed_reason:
            run.reason = f"the test run was stopped ({result.killed_reason})"
            return run
        cases = _testcases(report, nonce)
        recorded = _read_markers(markers, nonce)
        if isinstance(cases, str):
            if cases == "missing":
                run.reason = (
                    f"report missing: the test process exited early (code {result.exit_code}"
                    f" after {result.duration_s:.1f}s)"
                )
            else:
                run.reason = f"report unusable: {cases}"
            return run
        ok, why, passed_ids = _judge(expected, cases, recorded)
        if ok and result.exit_code != 0:
            ok, why = (
                False,
                f"every hidden test passed but pytest exited with code {result.exit_code}",
            )
        run.passed, run.passed_ids = ok, passed_ids
        run.reason = why or f"{len(passed_ids)} hidden test(s) passed in {result.duration_s:.1f}s"
        return run
    finally:
        await asyncio.to_thread(shutil.rmtree, private, True)
        await asyncio.to_thread(shutil.rmtree, work, True)


class CodeEditingRuntime(BaseRuntime):
    """One episode of a code-editing environment."""

    template = "code-editing"

    def __init__(self, spec: EnvironmentSpec, task: TaskSpec, config: CodeEditingConfig) -> None:
        super().__init__(spec, task)
        self.config = config
        self.files: dict[str, str] = {**config.files, **task_files(task)}
        self.test_runs = 0
        obj = "object"
        path_prop = {"path": {"type": "string", "description": "path relative to the project"}}
        self.add_tool(
            "list_files",
            "List every file path in the project.",
            {"type": obj, "properties": {}},
            lambda args: sorted(self.files),
        )
        self.add_tool(
            "read_file",
            "Read one file's content.",
            {"type": obj, "properties": path_prop, "required": ["path"]},
            self._read,
        )
        self.add_tool(
            "write_file",
            "Create or overwrite a file with the given content.",
            {
                "type": obj,
                "properties": {**path_prop, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
            self._write,
        )
        self.add_tool(
            "delete_file",
            "Delete a file.",
            {"type": obj, "properties": path_prop, "required": ["path"]},
            self._delete,
        )
        if config.test_command is not None:
            self.add_tool(
                "run_tests",
                "Run the project's tests and return whether they passed and their output.",
                {"type": obj, "properties": {}},
                self._run_tests,
            )

    def _read(self, args: dict[str, Any]) -> dict[str, Any]:
        path = check_file_path(args["path"])
        if path not in self.files:
            raise ToolError(f"no file {path!r}")
        return {"path": path, "content": self.files[path]}

    def _write(self, args: dict[str, Any]) -> dict[str, Any]:
        path = check_file_path(args["path"])
        content = args["content"]
        if len(content.encode("utf-8", "replace")) > MAX_FILE_BYTES:
            raise ToolError(f"file too large (max {MAX_FILE_BYTES} bytes)")
        if path not in self.files and len(self.files) >= MAX_FILES:
            raise ToolError(f"too many files (max {MAX_FILES})")
        created = path not in self.files
        self.files[path] = content
        return {"path": path, "created": created, "bytes": len(content)}

    def _delete(self, args: dict[str, Any]) -> dict[str, Any]:
        path = check_file_path(args["path"])
        if path not in self.files:
            raise ToolError(f"no file {path!r}")
        del self.files[path]
        return {"path": path, "deleted": True}

    async def _run_tests(self, args: dict[str, Any]) -> dict[str, Any]:
        self.test_runs += 1
        return await run_tests_in_sandbox(
            self.files,
            self.config.test_command,
            timeout_s=self.config.test_timeout_seconds,
            memory_mb=self.config.memory_mb,
            disk_mb=self.config.disk_mb,
        )

    def final_state(self) -> dict[str, Any]:
        """Every file's content and how often the agent ran the tests."""
        return {"files": copy.deepcopy(self.files), "testRuns": self.test_runs}


def _check_files(files: Any, where: str, out: list[str]) -> None:
    if files is None:
        return
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        out.append(f"{where}: must map paths to file contents")
        return
    for path in files:
        try:
            check_file_path(path)
        except ToolError as exc:
            out.append(f'{where}["{path}"]: {exc}')


class CodeEditingTemplate(Template):
    """The `code-editing` template."""

    name = "code-editing"
    aliases = ("code_editing", "codeediting")
    config_model = CodeEditingConfig
    runtime = CodeEditingRuntime
    fixed_tools = ("list_files", "read_file", "write_file", "delete_file")
    sandboxed = True

    def tool_names(self, config: CodeEditingConfig) -> list[str]:
        """The file tools, and run_tests when there is a test command."""
        extra = ["run_tests"] if config.test_command is not None else []
        return [*self.fixed_tools, *extra]

    def check_config(self, config: CodeEditingConfig, out: list[str]) -> None:
        """File paths stay inside the project; a test command is not empty."""
        for path in config.files:
            try:
                check_file_path(path)
            except ToolError as exc:
                out.append(f'config.files["{path}"]: {exc}')
        cmd = config.test_command
        if isinstance(cmd, list) and not cmd or isinstance(cmd, str) and not cmd.strip():
            out.append("config.testCommand: empty command")

    def state_roots(self, config: CodeEditingConfig | None) -> set[str]:
        """The final state's keys (see CodeEditingRuntime.final_state)."""
        return {"files", "testRuns"}

    def ground_truth_keys(self) -> set[str]:
        """The default verifier reads the expected files, the hidden tests and their command."""
        return {"files", "tests", "testCommand"}

    def check_task(
        self, config: CodeEditingConfig, task: TaskSpec, where: str, out: list[str]
    ) -> None:
        """A task's own files and its ground truth's files and tests map safe paths to text."""
        if isinstance(task.input, dict):
            _check_files(task.input.get("files"), f"{where}.input.files", out)
        gt = task.hidden_ground_truth
        if not isinstance(gt, dict):
            return
        try:
            pytest_run = is_pytest_command(
                test_command(gt.get("testCommand") or config.test_command)
            )
        except (ToolError, ValueError, TypeError):  # a malformed command: reported elsewhere
            pytest_run = False
        for key in ("files", "tests"):
            files = gt.get(key)
            if files is None:
                continue
            if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
                out.append(f"{where}.hiddenGroundTruth.{key}: must map paths to file contents")
                continue
            for path, text in files.items():
                try:
                    check_file_path(path)
                except ToolError as exc:
                    out.append(f'{where}.hiddenGroundTruth.{key}["{path}"]: {exc}')
                    continue
                if key == "tests" and path.endswith(".py") and pytest_run:
                    # tests_pass would fail every rollout on it, however right the model's fix.
                    try:
                        collect_hidden_tests(path, text)
                    except SyntaxError as exc:
                        line = f" (line {exc.lineno})" if exc.lineno else ""
                        out.append(
                            f'{where}.hiddenGroundTruth.tests["{path}"]: does not parse: '
                            f"{exc.msg}{line}"
                        )
                    except ValueError as exc:  # null bytes, before Python 3.11.4
                        out.append(
                            f'{where}.hiddenGroundTruth.tests["{path}"]: does not parse: {exc}'
                        )

    def default_primitives(self, task: TaskSpec) -> list[dict[str, Any]]:
        """state_match on the ground truth's files and/or tests_pass on its tests."""
        gt = task.hidden_ground_truth
        if not isinstance(gt, dict) or ("files" not in gt and "tests" not in gt):
            return [dict(STATE_MATCH)]
        prims: list[dict[str, Any]] = []
        if "files" in gt:
            prims.append(
                {
                    "name": "files",
                    "type": "state_match",
                    "expected": {"files": gt["files"]},
                    "partial": True,
                }
            )
        if "tests" in gt:
            prims.append({"name": "tests", "type": "tests_pass"})
        return prims


TEMPLATE = CodeEditingTemplate()
