"""The `code-editing` template: files in memory; tests run in the bubblewrap sandbox.

Tools: `list_files`, `read_file`, `write_file`, `delete_file`, and `run_tests` when the config has
a `testCommand`. The project is the config's `files` plus the task's own `input.files` (a task's
files win), so every task can bring its own code. The final state is `{"files": {path: content}, "testRuns": n}`. Hidden tests
from the task's ground truth (`tests`: path -> content) are only added by the `tests_pass`
verifier primitive, never shown to the agent.
"""

from __future__ import annotations

import copy
import posixpath
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from rollout.shared.contracts.envspec import CodeEditingConfig, EnvironmentSpec, TaskSpec
from rollout.shared.envs.templates.base import BaseRuntime, ToolError

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


async def run_tests_in_sandbox(
    files: dict[str, str],
    command: list[str] | str | None,
    *,
    timeout_s: float = 60.0,
    memory_mb: int = 512,
) -> dict[str, Any]:
    """Materialise files in a temp dir, run the command in the sandbox, report the outcome.

    Raises SandboxUnavailable (a RolloutError) when bubblewrap cannot be used: tests never run
    unsandboxed.
    """
    from rollout.shared.envs.sandbox import SandboxLimits, run_sandboxed

    argv = test_command(command)
    if not argv:
        raise ToolError("the test command is empty")
    limits = SandboxLimits(
        cpu_seconds=max(1, int(timeout_s)), memory_mb=memory_mb, wall_seconds=timeout_s
    )
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
        )

    def final_state(self) -> dict[str, Any]:
        """Every file's content and how often the agent ran the tests."""
        return {"files": copy.deepcopy(self.files), "testRuns": self.test_runs}
