"""`tests_pass`: the trusted tests pass on the final files, judged by their own results."""

from __future__ import annotations

from rollout.shared.contracts.envspec import CamelModel
from rollout.shared.envs.templates.base import ToolError
from rollout.shared.envs.templates.code_editing import (
    CodeEditingConfig,
    is_pytest_command,
    run_hidden_tests,
    run_tests_in_sandbox,
    task_files,
    test_command,
    trusted_test_files,
)
from rollout.shared.envs.verifiers.primitives.common import binary
from rollout.shared.envs.verifiers.registry import (
    InfraError,
    Outcome,
    ScoreContext,
    register,
)
from rollout.shared.errors import RolloutError


class TestsPassParams(CamelModel):
    """`tests_pass`: the task's tests pass on the final files, run in the sandbox."""

    __test__ = False  # not a pytest class, despite the name

    command: list[str] | str | None = None
    files: dict[str, str] | None = None


@register(
    "tests_pass",
    TestsPassParams,
    templates=("code-editing",),
    truth_fields={"tests": "files", "testCommand": "command"},
)
async def tests_pass(p: TestsPassParams, ctx: ScoreContext) -> Outcome:
    """The trusted tests pass on the final files, run in the sandbox, judged by their own results.

    With a pytest command (the default), the trusted tests (the hidden ones from the ground
    truth `tests` or params.files, plus the config's and the task's own test files as the author
    wrote them) run from a private read-only directory, never the work dir, under `python -I`
    with a pinned config, rootdir and plugin set, so none of the model's files (conftest.py,
    pytest.ini, pyproject.toml, setup.cfg, tox.ini, pytest.py, sitecustomize.py, .pth) has a
    say. It passes only when the JUnit report written to a private directory lists every test
    found by parsing the trusted files, each passed (skipped, xfailed and errors fail), the
    probe recorded that each body ran to its end with no tampering, and pytest exited 0. The
    exit code alone never passes.

    With `testIsolation: process` (the default) the model's code runs in a second sandbox that
    sees nothing of the tests' (`_xproc_*`): the tests reach it through proxies, values come
    back as data, and a model's object never equals a value of the tests'. Nothing it runs can
    write the evidence. With `in-process` the tests import it: code written against this exact
    harness can forge the records, and a value whose `__eq__` always returns True satisfies
    `assert add(2, 3) == 5`.

    A command that is not pytest keeps exit-code semantics: it runs in the work dir with the
    hidden files laid over the model's, and a model can forge its result; prefer pytest.
    """
    files = ctx.state.get("files")
    if not isinstance(files, dict):
        return binary(False, "no files in the final state")
    gt = ctx.ground_truth if isinstance(ctx.ground_truth, dict) else {}
    overlay = p.files if p.files is not None else gt.get("tests") or {}
    if not isinstance(overlay, dict):
        return binary(False, "ground truth `tests` must map paths to contents")
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
                disk_mb=config.disk_mb,
                isolate=config.test_isolation == "process",
            )
            return binary(run.passed, run.reason)
        result = await run_tests_in_sandbox(
            {**files, **overlay},
            command,
            timeout_s=config.test_timeout_seconds,
            memory_mb=config.memory_mb,
            disk_mb=config.disk_mb,
        )
    except ToolError as exc:
        return binary(False, f"cannot run tests: {exc}")
    except RolloutError as exc:  # SandboxUnavailable: never run unsandboxed
        raise InfraError(str(exc)) from None
    if result["passed"]:
        return binary(True, f"tests passed in {result['durationS']}s (exit code of {command!r})")
    if result["timedOut"]:
        return binary(False, "tests timed out")
    tail = (result["stdout"] + "\n" + result["stderr"]).strip().splitlines()[-3:]
    why = result["killedReason"] or f"exit code {result['exitCode']}"
    return binary(False, f"tests failed ({why}): " + " | ".join(tail))
