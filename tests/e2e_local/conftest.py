"""Fixtures for end-to-end `rollout test` runs against the scripted OpenAI-compatible server."""

import sys
from pathlib import Path

# Test folders have no __init__.py; put tests/ on the path so `fakes` imports from anywhere.
if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import json  # noqa: E402
import textwrap  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from fakes.openai_server import FakeOpenAI, fake_openai  # noqa: E402, F401  (a fixture)

from rollout.cli import main  # noqa: E402


@dataclass
class CliRun:
    """What one `rollout test` invocation produced."""

    code: int
    stdout: str
    stderr: str
    server: FakeOpenAI

    @property
    def report(self) -> dict[str, Any]:
        """The --json document."""
        return json.loads(self.stdout)

    def task(self, index: int = 0, env: int = 0) -> dict[str, Any]:
        """One task's report."""
        return self.report["environments"][env]["tasks"][index]


class _CurrentStderr:
    """Writes to whatever sys.stderr is now (pytest swaps it per test)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@pytest.fixture(scope="session", autouse=True)
def _logs_to_current_stderr() -> None:
    # The CLI configures structlog once per process with the stderr of that moment; in-process
    # CLI runs under pytest would then write into a closed capture. Configure it first, here.
    import structlog

    from rollout.shared import observability

    observability.configure_logging("e2e-tests", level="WARNING")
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()))


@pytest.fixture
def rollout_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> Iterator[Callable[..., CliRun]]:
    """Write an env file, serve `script` from a fake OpenAI server, run `rollout test` on it.

    The model is `openai/scripted` with OPENAI_BASE_URL pointing at the fake server: the real
    CLI, the real loader, runtimes and verifier, and real HTTP through our client.
    """
    servers: list[FakeOpenAI] = []

    def run(
        source: str,
        script: Any,
        *args: str,
        json_output: bool = True,
        files: dict[str, str] | None = None,
        api_key: str = "sk-e2e",
        model: str = "openai/scripted",
    ) -> CliRun:
        server = FakeOpenAI(script, api_key="sk-e2e").start()
        servers.append(server)
        env_file = tmp_path / "env_under_test.py"
        env_file.write_text(textwrap.dedent(source))
        for rel, content in (files or {}).items():
            target = tmp_path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(content))
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", api_key)
        argv = ["test", str(env_file), "--model", model, *args]
        if json_output:
            argv.append("--json")
        capsys.readouterr()
        code = main(argv)
        out, err = capsys.readouterr()
        return CliRun(code, out, err, server)

    yield run
    for server in servers:
        server.stop()
